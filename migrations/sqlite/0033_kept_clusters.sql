-- Deleted clusters keep what recovery needs (SQLite). Keep equivalent to
-- migrations/postgres/0033_kept_clusters.sql.
-- A deleted cluster's row stays `deleted` until `kept_until` (`serve --keep-deleted-days`):
-- its sealed trust (CAs, service-account keys, the secrets-encryption key, the CA standby) and
-- its stored snapshots, so `restore_from` can found a cluster from it. Everything else it had
-- (machines, nodes, pools, certificates) is gone with the delete; the purge ends the rest.
-- clusters.phase: rebuilt as a checked column with `deleted` (SQLite cannot change a CHECK);
-- the triggers on clusters (migration 0031) are dropped for it and made again as they were.
DROP TRIGGER cluster_events_accepted;
DROP TRIGGER cluster_events_phase;
ALTER TABLE clusters ADD COLUMN phase_checked TEXT NOT NULL DEFAULT 'provisioning'
    CHECK (phase_checked IN ('provisioning', 'founded', 'compensating', 'failed', 'deleting',
                             'deleted'));
UPDATE clusters SET phase_checked = phase;
DROP INDEX clusters_phase;
ALTER TABLE clusters DROP COLUMN phase;
ALTER TABLE clusters RENAME COLUMN phase_checked TO phase;
CREATE INDEX clusters_phase ON clusters (phase, updated_at);
CREATE TRIGGER cluster_events_accepted AFTER INSERT ON clusters
BEGIN
    INSERT INTO cluster_events (cluster_id, kind, phase, created_at)
    VALUES (NEW.id, 'cluster', NEW.phase, NEW.created_at);
END;
CREATE TRIGGER cluster_events_phase AFTER UPDATE OF phase ON clusters
WHEN NEW.phase <> OLD.phase
BEGIN
    INSERT INTO cluster_events (cluster_id, kind, phase, reason, message, created_at)
    VALUES (NEW.id, 'cluster', NEW.phase, NEW.error_reason, NEW.error_message, NEW.updated_at);
END;
ALTER TABLE clusters ADD COLUMN deleted_at BIGINT;
ALTER TABLE clusters ADD COLUMN kept_until BIGINT;
-- A deleted cluster's name is free again in its org.
DROP INDEX clusters_org_name;
CREATE UNIQUE INDEX clusters_org_name ON clusters (org_id, name)
    WHERE name <> '' AND phase <> 'deleted';
-- The purge pass's question: which kept clusters are due.
CREATE INDEX clusters_kept ON clusters (kept_until) WHERE phase = 'deleted';
