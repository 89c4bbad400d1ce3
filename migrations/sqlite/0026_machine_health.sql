-- Machine health (SQLite). Keep equivalent to
-- migrations/postgres/0026_machine_health.sql.
-- `last_seen_at`: the last signed request of the node's agent (its sync timer's generation
-- poll, every five minutes and some jitter, or any other), kept to the minute. NULL: not seen
-- since this column exists (a node made before it is judged from its first request on).
ALTER TABLE cluster_nodes ADD COLUMN last_seen_at BIGINT;
-- What the compute API last said of the node's VM when it was not running: `gone` (it no
-- longer knows it) or its state (`stopped`, `terminated`, ...), and since when a health pass
-- has seen it so. Both NULL while it runs.
ALTER TABLE cluster_nodes ADD COLUMN vm_state TEXT;
ALTER TABLE cluster_nodes ADD COLUMN vm_down_since BIGINT;
-- The cluster's health policy (JSON, see api/src/health/policy.rs); NULL: the defaults.
ALTER TABLE clusters ADD COLUMN health_policy TEXT;
-- Each machine replaced because it was unhealthy: what the retry limit counts (per machine set
-- within the policy's period) and what the cluster's `RemediationAllowed` tells of. Kept with
-- the cluster. `pool_id` NULL: a control-plane member.
CREATE TABLE remediations (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    cluster_id  BIGINT NOT NULL REFERENCES clusters (id) ON DELETE CASCADE,
    pool_id     BIGINT,
    vm_id       BIGINT NOT NULL,
    node_name   TEXT   NOT NULL,
    reason      TEXT   NOT NULL,
    message     TEXT   NOT NULL,
    created_at  BIGINT NOT NULL
);
CREATE INDEX remediations_by_cluster ON remediations (cluster_id, created_at);
