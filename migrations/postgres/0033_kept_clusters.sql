-- Deleted clusters keep what recovery needs (PostgreSQL). Keep equivalent to
-- migrations/sqlite/0033_kept_clusters.sql.
-- A deleted cluster's row stays `deleted` until `kept_until` (`serve --keep-deleted-days`):
-- its sealed trust (CAs, service-account keys, the secrets-encryption key, the CA standby) and
-- its stored snapshots, so `restore_from` can found a cluster from it. Everything else it had
-- (machines, nodes, pools, certificates) is gone with the delete; the purge ends the rest.
ALTER TABLE clusters DROP CONSTRAINT clusters_phase_check;
ALTER TABLE clusters ADD CONSTRAINT clusters_phase_check
    CHECK (phase IN ('provisioning', 'founded', 'compensating', 'failed', 'deleting', 'deleted'));
ALTER TABLE clusters ADD COLUMN deleted_at BIGINT;
ALTER TABLE clusters ADD COLUMN kept_until BIGINT;
-- A deleted cluster's name is free again in its org.
DROP INDEX clusters_org_name;
CREATE UNIQUE INDEX clusters_org_name ON clusters (org_id, name)
    WHERE name <> '' AND phase <> 'deleted';
-- The purge pass's question: which kept clusters are due.
CREATE INDEX clusters_kept ON clusters (kept_until) WHERE phase = 'deleted';
