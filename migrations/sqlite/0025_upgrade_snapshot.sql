-- The upgrade's preflight etcd snapshot (SQLite). Keep equivalent to
-- migrations/postgres/0025_upgrade_snapshot.sql.
-- A Kubernetes upgrade asks a voter for a snapshot (trigger 'upgrade') as it starts, and no
-- control-plane member is handed the new version until that snapshot is stored:
-- `clusters.upgrade_snapshot_id` names it (NULL: the upgrade, if any, waits for none — the
-- operator skipped it, or a rollback runs).
-- SQLite cannot change a CHECK constraint: the table is made again (no table refers to it).
CREATE TABLE snapshots_next (
    id               INTEGER PRIMARY KEY AUTOINCREMENT,
    cluster_id       BIGINT  NOT NULL REFERENCES clusters (id) ON DELETE CASCADE,
    state            TEXT    NOT NULL CHECK (state IN ('requested', 'stored', 'failed')),
    trigger          TEXT    NOT NULL CHECK (trigger IN ('operator', 'schedule', 'upgrade')),
    node_id          BIGINT  NOT NULL,
    member_name      TEXT    NOT NULL,
    requested_at     BIGINT  NOT NULL,
    not_after        BIGINT  NOT NULL,
    taken_at         BIGINT,
    revision         BIGINT,
    etcd_version     TEXT,
    size_bytes       BIGINT,
    sha256           TEXT,
    object_key       TEXT,
    ca_sha256        TEXT,
    error            TEXT
);
INSERT INTO snapshots_next (id, cluster_id, state, trigger, node_id, member_name, requested_at,
    not_after, taken_at, revision, etcd_version, size_bytes, sha256, object_key, ca_sha256, error)
SELECT id, cluster_id, state, trigger, node_id, member_name, requested_at, not_after, taken_at,
    revision, etcd_version, size_bytes, sha256, object_key, ca_sha256, error FROM snapshots;
-- Ids are never reused (a deleted snapshot's id names no other): the sequence goes along.
DELETE FROM sqlite_sequence WHERE name = 'snapshots_next';
INSERT INTO sqlite_sequence (name, seq)
    SELECT 'snapshots_next', seq FROM sqlite_sequence WHERE name = 'snapshots';
DROP TABLE snapshots;
ALTER TABLE snapshots_next RENAME TO snapshots;
CREATE INDEX snapshots_cluster ON snapshots (cluster_id, id);
CREATE INDEX snapshots_asked ON snapshots (node_id) WHERE state = 'requested';
ALTER TABLE clusters ADD COLUMN upgrade_snapshot_id BIGINT;
