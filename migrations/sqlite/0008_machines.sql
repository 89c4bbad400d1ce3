-- Day-2 machines (SQLite). Keep equivalent to migrations/postgres/0008_machines.sql.
-- A cluster hands out machine ordinals from a counter, so machines added after founding (a
-- pool's workers, later control-plane members) never reuse one; the journal names the pool a
-- VM was made for; a node being removed is drained first (`draining` → `drained`), by the
-- control-plane node named in `drain_by` at generation `drain_generation`; a pool being
-- deleted goes to zero first; one API process at a time converges a pool (lease), and the
-- last convergence that failed says why.
ALTER TABLE clusters ADD COLUMN last_ordinal BIGINT NOT NULL DEFAULT 0;
UPDATE clusters SET last_ordinal = COALESCE(
    (SELECT MAX(r.ordinal) FROM cluster_resources r WHERE r.cluster_id = clusters.id), 0);
ALTER TABLE cluster_resources ADD COLUMN pool_id BIGINT;
CREATE INDEX cluster_resources_pool ON cluster_resources (pool_id);
ALTER TABLE cluster_nodes ADD COLUMN removal TEXT CHECK (removal IN ('draining', 'drained'));
ALTER TABLE cluster_nodes ADD COLUMN removal_since BIGINT;
ALTER TABLE cluster_nodes ADD COLUMN drain_by BIGINT;
ALTER TABLE cluster_nodes ADD COLUMN drain_generation BIGINT;
ALTER TABLE node_pools ADD COLUMN deleting INTEGER NOT NULL DEFAULT 0;
ALTER TABLE node_pools ADD COLUMN lease_until BIGINT;
ALTER TABLE node_pools ADD COLUMN last_error TEXT;
