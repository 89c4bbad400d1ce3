-- In-place restores of a cluster's etcd from one of its snapshots (PostgreSQL). Keep equivalent
-- to migrations/sqlite/0023_restores.sql.
-- A restore moves through `phase`: 'stop' (every member puts its control-plane static pods
-- aside and stops etcd), 'restore' (every member restores the same snapshot into a fresh data
-- directory — `token` its new cluster token, the members below its initial cluster,
-- `bump_revision` added to the snapshot's revision and every older revision marked
-- compacted — and starts etcd), 'start' (the members put their static pods back, one at a
-- time), then 'done'; or 'failed', `error` saying where and why. At most one restore of a
-- cluster is not done or failed.
CREATE TABLE restores (
    id            BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    cluster_id    BIGINT NOT NULL REFERENCES clusters (id) ON DELETE CASCADE,
    -- The cluster the snapshot belongs to: this one, or the one it was founded from
    -- (`restore_sources`).
    source_cluster_id BIGINT NOT NULL,
    snapshot_id   BIGINT NOT NULL,
    sha256        TEXT   NOT NULL,
    phase         TEXT   NOT NULL CHECK (phase IN ('stop', 'restore', 'start', 'done', 'failed')),
    token         TEXT   NOT NULL,
    bump_revision BIGINT NOT NULL CHECK (bump_revision > 0),
    started_at    BIGINT NOT NULL,
    updated_at    BIGINT NOT NULL,
    error         TEXT
);
CREATE INDEX restores_cluster ON restores (cluster_id, id);
CREATE UNIQUE INDEX restores_running ON restores (cluster_id)
    WHERE phase IN ('stop', 'restore', 'start');
-- Each member of a restore, fixed when it starts, and how far it got: 0 nothing yet,
-- 1 stopped, 2 restored (its etcd started from the snapshot), 3 started.
CREATE TABLE restore_members (
    restore_id  BIGINT NOT NULL REFERENCES restores (id) ON DELETE CASCADE,
    node_id     BIGINT NOT NULL,
    ordinal     BIGINT NOT NULL,
    member_name TEXT   NOT NULL,
    peer_url    TEXT   NOT NULL,
    done        BIGINT NOT NULL DEFAULT 0 CHECK (done BETWEEN 0 AND 3),
    PRIMARY KEY (restore_id, node_id)
);
-- A cluster founded from another cluster's snapshot (`POST /clusters` with `restore_from`):
-- its etcd is restored from it once its control plane is up.
CREATE TABLE restore_sources (
    cluster_id        BIGINT PRIMARY KEY REFERENCES clusters (id) ON DELETE CASCADE,
    source_cluster_id BIGINT NOT NULL,
    snapshot_id       BIGINT NOT NULL
);
