-- Snapshots and restores on the cluster's stream (PostgreSQL). Keep equivalent to
-- migrations/sqlite/0030_snapshot_restore_events.sql.
-- When a snapshot was stored or failed.
ALTER TABLE snapshots ADD COLUMN finished_at BIGINT;

-- Every snapshot is a change when it is asked for and again when it is stored or fails (kind
-- 'snapshot'; `phase` its state, `snapshot_id` which one, `vm_id` the member asked); so is
-- every restore as it enters each of its phases (kind 'restore'; `snapshot_id` the snapshot it
-- restores).
ALTER TABLE cluster_events ADD COLUMN snapshot_id BIGINT;
ALTER TABLE cluster_events DROP CONSTRAINT cluster_events_kind_check;
ALTER TABLE cluster_events ADD CONSTRAINT cluster_events_kind_check
    CHECK (kind IN ('cluster', 'node', 'report', 'remediation', 'snapshot',
        'restore'));

CREATE FUNCTION cluster_events_snapshot() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        INSERT INTO cluster_events (cluster_id, kind, vm_id, phase, message, snapshot_id,
            created_at)
        VALUES (NEW.cluster_id, 'snapshot',
            (SELECT vm_id FROM cluster_nodes WHERE id = NEW.node_id), 'requested',
            'asked of ' || NEW.member_name || ' (' || NEW.trigger || ')', NEW.id,
            NEW.requested_at);
    ELSIF NEW.state IS DISTINCT FROM OLD.state THEN
        INSERT INTO cluster_events (cluster_id, kind, vm_id, phase, reason, message, snapshot_id,
            created_at)
        VALUES (NEW.cluster_id, 'snapshot',
            (SELECT vm_id FROM cluster_nodes WHERE id = NEW.node_id), NEW.state,
            CASE WHEN NEW.state = 'failed' THEN 'SnapshotFailed' END,
            CASE WHEN NEW.state = 'stored'
                THEN 'revision ' || NEW.revision || ', ' || NEW.size_bytes || ' bytes, etcd '
                    || NEW.etcd_version
                ELSE NEW.error END,
            NEW.id, COALESCE(NEW.finished_at, NEW.requested_at));
    END IF;
    RETURN NULL;
END;
$$;
CREATE TRIGGER cluster_events_snapshot AFTER INSERT OR UPDATE OF state ON snapshots
FOR EACH ROW EXECUTE FUNCTION cluster_events_snapshot();

CREATE FUNCTION cluster_events_restore() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        INSERT INTO cluster_events (cluster_id, kind, phase, message, snapshot_id, created_at)
        VALUES (NEW.cluster_id, 'restore', NEW.phase,
            'restore ' || NEW.id || ' of snapshot ' || NEW.snapshot_id || ' of cluster '
                || NEW.source_cluster_id,
            NEW.snapshot_id, NEW.started_at);
    ELSIF NEW.phase IS DISTINCT FROM OLD.phase THEN
        INSERT INTO cluster_events (cluster_id, kind, phase, reason, message, snapshot_id,
            created_at)
        VALUES (NEW.cluster_id, 'restore', NEW.phase,
            CASE WHEN NEW.phase = 'failed' THEN 'RestoreFailed' END,
            CASE WHEN NEW.phase = 'failed' THEN NEW.error ELSE 'restore ' || NEW.id END,
            NEW.snapshot_id, NEW.updated_at);
    END IF;
    RETURN NULL;
END;
$$;
CREATE TRIGGER cluster_events_restore AFTER INSERT OR UPDATE OF phase ON restores
FOR EACH ROW EXECUTE FUNCTION cluster_events_restore();
