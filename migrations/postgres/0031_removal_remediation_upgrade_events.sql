-- Node removals, finished remediations and upgrade steps on the cluster's stream (PostgreSQL).
-- Keep equivalent to migrations/sqlite/0031_removal_remediation_upgrade_events.sql.

-- The stream's kinds are the API's to check (`api/src/db/events.rs` reads each one it knows):
-- a CHECK here made every new kind a table rebuild on SQLite.
ALTER TABLE cluster_events DROP CONSTRAINT cluster_events_kind_check;

-- When the machine a remediation replaced was gone and its machine set back at its size with
-- every node up (the remediation's end); NULL while it runs.
ALTER TABLE remediations ADD COLUMN finished_at BIGINT;

-- A finished remediation is a change (kind 'remediation', `state` 'finished'; the one that
-- started it has no state).
CREATE FUNCTION cluster_events_remediation_finished() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF OLD.finished_at IS NULL AND NEW.finished_at IS NOT NULL THEN
        INSERT INTO cluster_events (cluster_id, kind, vm_id, phase, state, reason, message,
            created_at)
        VALUES (NEW.cluster_id, 'remediation', NEW.vm_id,
            CASE WHEN NEW.pool_id IS NULL THEN 'control-plane' ELSE 'worker' END, 'finished',
            NEW.reason, NEW.node_name || ': replaced', NEW.finished_at);
    END IF;
    RETURN NULL;
END;
$$;
CREATE TRIGGER cluster_events_remediation_finished AFTER UPDATE OF finished_at ON remediations
FOR EACH ROW EXECUTE FUNCTION cluster_events_remediation_finished();

-- An upgrade's steps (kind 'upgrade'): the control plane's target changed ('started', the
-- message "from FROM to TO"), a member runs a new release ('member', at its report's time), every
-- member runs the target ('done'), a pool takes another release ('pool'). A member's first
-- release (its founding or its join) is not a step.
CREATE FUNCTION cluster_events_upgrade_started() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.kubernetes_version IS DISTINCT FROM OLD.kubernetes_version THEN
        INSERT INTO cluster_events (cluster_id, kind, phase, message, created_at)
        VALUES (NEW.id, 'upgrade', 'started',
            'from ' || OLD.kubernetes_version || ' to ' || NEW.kubernetes_version,
            NEW.updated_at);
    END IF;
    RETURN NULL;
END;
$$;
CREATE TRIGGER cluster_events_upgrade_started AFTER UPDATE OF kubernetes_version ON clusters
FOR EACH ROW EXECUTE FUNCTION cluster_events_upgrade_started();

CREATE FUNCTION cluster_events_upgrade_member() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    at BIGINT;
BEGIN
    IF NEW.role = 'control-plane' AND OLD.kubernetes_version IS NOT NULL
        AND NEW.kubernetes_version IS DISTINCT FROM OLD.kubernetes_version THEN
        at := COALESCE((SELECT MAX(created_at) FROM node_reports WHERE node_id = NEW.id),
            NEW.created_at);
        INSERT INTO cluster_events (cluster_id, kind, vm_id, phase, message, created_at)
        VALUES (NEW.cluster_id, 'upgrade', NEW.vm_id, 'member',
            NEW.node_name || ' runs ' || NEW.kubernetes_version, at);
        INSERT INTO cluster_events (cluster_id, kind, phase, message, created_at)
        SELECT c.id, 'upgrade', 'done',
            'every control-plane member runs ' || c.kubernetes_version, at
        FROM clusters c
        WHERE c.id = NEW.cluster_id AND c.kubernetes_version = NEW.kubernetes_version
          AND NOT EXISTS (SELECT 1 FROM cluster_nodes n WHERE n.cluster_id = c.id
              AND n.role = 'control-plane'
              AND (n.etcd_membership IS NULL OR n.etcd_membership <> 'leaving')
              AND (n.kubernetes_version IS NULL OR n.kubernetes_version <> c.kubernetes_version));
    END IF;
    RETURN NULL;
END;
$$;
CREATE TRIGGER cluster_events_upgrade_member AFTER UPDATE OF kubernetes_version ON cluster_nodes
FOR EACH ROW EXECUTE FUNCTION cluster_events_upgrade_member();

CREATE FUNCTION cluster_events_upgrade_pool() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.kubernetes_version IS DISTINCT FROM OLD.kubernetes_version THEN
        INSERT INTO cluster_events (cluster_id, kind, phase, message, created_at)
        VALUES (NEW.cluster_id, 'upgrade', 'pool',
            'pool ' || NEW.name || ' takes ' || NEW.kubernetes_version, NEW.updated_at);
    END IF;
    RETURN NULL;
END;
$$;
CREATE TRIGGER cluster_events_upgrade_pool AFTER UPDATE OF kubernetes_version ON node_pools
FOR EACH ROW EXECUTE FUNCTION cluster_events_upgrade_pool();
