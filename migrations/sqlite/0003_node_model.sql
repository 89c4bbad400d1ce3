-- The node model of day 2 (SQLite). Keep equivalent to migrations/postgres/0003_node_model.sql.
-- Phases become closed sets checked by the database; a node gains a role, the state of its
-- last report, generations (desired by the API, handed out, applied by the agent) and the
-- public half of the key it signs day-2 requests with.

-- clusters.phase: rebuilt as a checked column (SQLite cannot add a CHECK to a column).
ALTER TABLE clusters ADD COLUMN phase_checked TEXT NOT NULL DEFAULT 'provisioning'
    CHECK (phase_checked IN ('provisioning', 'founded', 'compensating', 'failed', 'deleting'));
UPDATE clusters SET phase_checked = phase;
DROP INDEX clusters_phase;
ALTER TABLE clusters DROP COLUMN phase;
ALTER TABLE clusters RENAME COLUMN phase_checked TO phase;
CREATE INDEX clusters_phase ON clusters (phase, updated_at);

-- cluster_nodes.phase `etcd:failed` becomes phase `etcd` and phase_state `failed`.
ALTER TABLE cluster_nodes ADD COLUMN phase_checked TEXT NOT NULL DEFAULT 'pending'
    CHECK (phase_checked IN ('pending', 'fetch', 'verify', 'files', 'prereqs', 'services', 'etcd',
                             'apiserver', 'addons', 'complete', 'sync'));
ALTER TABLE cluster_nodes ADD COLUMN phase_state TEXT NOT NULL DEFAULT 'succeeded'
    CHECK (phase_state IN ('started', 'succeeded', 'failed'));
UPDATE cluster_nodes SET
    phase_checked = CASE WHEN instr(phase, ':') > 0 THEN substr(phase, 1, instr(phase, ':') - 1) ELSE phase END,
    phase_state = CASE WHEN instr(phase, ':') > 0 THEN substr(phase, instr(phase, ':') + 1) ELSE 'succeeded' END;
ALTER TABLE cluster_nodes DROP COLUMN phase;
ALTER TABLE cluster_nodes RENAME COLUMN phase_checked TO phase;

ALTER TABLE cluster_nodes ADD COLUMN role TEXT NOT NULL DEFAULT 'control-plane'
    CHECK (role IN ('control-plane', 'worker'));
ALTER TABLE cluster_nodes ADD COLUMN desired_generation BIGINT NOT NULL DEFAULT 1
    CHECK (desired_generation >= 1);
ALTER TABLE cluster_nodes ADD COLUMN handed_generation BIGINT NOT NULL DEFAULT 0
    CHECK (handed_generation >= 0);
ALTER TABLE cluster_nodes ADD COLUMN applied_generation BIGINT NOT NULL DEFAULT 0
    CHECK (applied_generation >= 0);
ALTER TABLE cluster_nodes ADD COLUMN node_key TEXT;
-- Nodes that completed before generations existed applied their first (and only) bundle.
UPDATE cluster_nodes SET handed_generation = 1, applied_generation = 1 WHERE phase = 'complete';

-- Nonces of signed day-2 requests, kept until their timestamp can no longer be accepted.
CREATE TABLE node_request_nonces (
    node_id     BIGINT  NOT NULL REFERENCES cluster_nodes (id) ON DELETE CASCADE,
    nonce       TEXT    NOT NULL,
    expires_at  BIGINT  NOT NULL,
    PRIMARY KEY (node_id, nonce)
);
CREATE INDEX node_request_nonces_expiry ON node_request_nonces (expires_at);
