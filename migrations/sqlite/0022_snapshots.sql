-- etcd snapshots (SQLite). Keep equivalent to migrations/postgres/0022_snapshots.sql.
-- A snapshot is asked of one healthy voter (`node_id`), which uploads it before `not_after`;
-- the API encrypts it with the cluster's snapshot key (`clusters.snapshot_key`, sealed by the
-- KEK) on its way to the object store (`object_key`). `sha256` is the digest of the snapshot
-- as etcd wrote it (its own trailing checksum included); `ca_sha256` the digest of the
-- cluster CA certificate it was taken under (what a restore into a new cluster must keep).
CREATE TABLE snapshots (
    id               INTEGER PRIMARY KEY AUTOINCREMENT,
    cluster_id       BIGINT  NOT NULL REFERENCES clusters (id) ON DELETE CASCADE,
    state            TEXT    NOT NULL CHECK (state IN ('requested', 'stored', 'failed')),
    trigger          TEXT    NOT NULL CHECK (trigger IN ('operator', 'schedule')),
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
CREATE INDEX snapshots_cluster ON snapshots (cluster_id, id);
-- Every node's generation check asks whether a snapshot is asked of it.
CREATE INDEX snapshots_asked ON snapshots (node_id) WHERE state = 'requested';
ALTER TABLE clusters ADD COLUMN snapshot_key TEXT;
-- The schedule: a snapshot every `snapshot_every_secs` (0: only when an operator asks), the
-- newest `snapshot_retain` stored ones kept.
ALTER TABLE clusters ADD COLUMN snapshot_every_secs BIGINT NOT NULL DEFAULT 43200
    CHECK (snapshot_every_secs >= 0);
ALTER TABLE clusters ADD COLUMN snapshot_retain BIGINT NOT NULL DEFAULT 14
    CHECK (snapshot_retain >= 1);
