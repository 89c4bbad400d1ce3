-- Control-plane remediation, pools' own health policies, and remediation events (SQLite). Keep equivalent to
-- migrations/postgres/0027_remediation.sql.
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
-- node). SQLite cannot change a CHECK constraint: the table is made again (no table refers to
-- it), its triggers dropped first and made again after, unchanged.
DROP TRIGGER cluster_events_accepted;
DROP TRIGGER cluster_events_phase;
DROP TRIGGER cluster_events_node;
DROP TRIGGER cluster_events_report;
CREATE TABLE cluster_events_next (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    cluster_id  BIGINT  NOT NULL REFERENCES clusters (id) ON DELETE CASCADE,
    kind        TEXT    NOT NULL CHECK (kind IN ('cluster', 'node', 'report', 'remediation')),
    vm_id       BIGINT,
    phase       TEXT    NOT NULL,
    state       TEXT,
    reason      TEXT,
    message     TEXT,
    created_at  BIGINT  NOT NULL
);
INSERT INTO cluster_events_next (id, cluster_id, kind, vm_id, phase, state, reason, message,
    created_at)
SELECT id, cluster_id, kind, vm_id, phase, state, reason, message, created_at FROM cluster_events;
-- Event ids are stream positions (Last-Event-ID): never reused, the sequence goes along.
DELETE FROM sqlite_sequence WHERE name = 'cluster_events_next';
INSERT INTO sqlite_sequence (name, seq)
    SELECT 'cluster_events_next', seq FROM sqlite_sequence WHERE name = 'cluster_events';
DROP TABLE cluster_events;
ALTER TABLE cluster_events_next RENAME TO cluster_events;
CREATE INDEX cluster_events_cluster ON cluster_events (cluster_id, id);
CREATE INDEX cluster_events_age ON cluster_events (created_at);

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

CREATE TRIGGER cluster_events_node AFTER INSERT ON cluster_nodes
BEGIN
    INSERT INTO cluster_events (cluster_id, kind, vm_id, phase, created_at)
    VALUES (NEW.cluster_id, 'node', NEW.vm_id, NEW.phase, NEW.created_at);
END;

CREATE TRIGGER cluster_events_report AFTER INSERT ON node_reports
BEGIN
    INSERT INTO cluster_events (cluster_id, kind, vm_id, phase, state, message, created_at)
    SELECT cluster_id, 'report', vm_id, NEW.phase, NEW.state, NEW.message, NEW.created_at
    FROM cluster_nodes WHERE id = NEW.node_id;
END;

CREATE TRIGGER cluster_events_remediation AFTER INSERT ON remediations
BEGIN
    INSERT INTO cluster_events (cluster_id, kind, vm_id, phase, reason, message, created_at)
    VALUES (NEW.cluster_id, 'remediation', NEW.vm_id,
        CASE WHEN NEW.pool_id IS NULL THEN 'control-plane' ELSE 'worker' END,
        NEW.reason, NEW.node_name || ': ' || NEW.message, NEW.created_at);
END;
