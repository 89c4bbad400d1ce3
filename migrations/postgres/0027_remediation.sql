-- Control-plane remediation, pools' own health policies, and remediation events (PostgreSQL). Keep equivalent to
-- migrations/sqlite/0027_remediation.sql.
-- Why the reconciler's last health pass left an unhealthy control-plane member alone, as JSON
-- (`reason`, `message`, `since`; see api/src/health/blocked.rs): what the cluster's
-- `RemediationAllowed` condition says. NULL: nothing is held back.
ALTER TABLE clusters ADD COLUMN remediation_blocked TEXT;
-- A pool's own health policy (JSON, as `clusters.health_policy`); NULL: its cluster's.
ALTER TABLE node_pools ADD COLUMN health_policy TEXT;
-- Why the pool's last convergence left an unhealthy worker alone (as the cluster's column).
ALTER TABLE node_pools ADD COLUMN remediation_blocked TEXT;

-- Every remediation is a change on the cluster's stream (kind 'remediation'; `phase` says which
-- machine set: 'control-plane' or 'worker'; `reason` is Cluster API's; the message names the
-- node).
ALTER TABLE cluster_events DROP CONSTRAINT cluster_events_kind_check;
ALTER TABLE cluster_events ADD CONSTRAINT cluster_events_kind_check
    CHECK (kind IN ('cluster', 'node', 'report', 'remediation'));

CREATE FUNCTION cluster_events_remediation() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO cluster_events (cluster_id, kind, vm_id, phase, reason, message, created_at)
    VALUES (NEW.cluster_id, 'remediation', NEW.vm_id,
        CASE WHEN NEW.pool_id IS NULL THEN 'control-plane' ELSE 'worker' END,
        NEW.reason, NEW.node_name || ': ' || NEW.message, NEW.created_at);
    RETURN NULL;
END;
$$;
CREATE TRIGGER cluster_events_remediation AFTER INSERT ON remediations
FOR EACH ROW EXECUTE FUNCTION cluster_events_remediation();
