-- The upgrade's preflight etcd snapshot (PostgreSQL). Keep equivalent to
-- migrations/sqlite/0025_upgrade_snapshot.sql.
-- A Kubernetes upgrade asks a voter for a snapshot (trigger 'upgrade') as it starts, and no
-- control-plane member is handed the new version until that snapshot is stored:
-- `clusters.upgrade_snapshot_id` names it (NULL: the upgrade, if any, waits for none — the
-- operator skipped it, or a rollback runs).
ALTER TABLE snapshots DROP CONSTRAINT snapshots_trigger_check;
ALTER TABLE snapshots ADD CONSTRAINT snapshots_trigger_check
    CHECK (trigger IN ('operator', 'schedule', 'upgrade'));
ALTER TABLE clusters ADD COLUMN upgrade_snapshot_id BIGINT;
