-- Node removals, finished remediations and upgrade steps on the cluster's stream (SQLite).
-- Keep equivalent to migrations/postgres/0031_removal_remediation_upgrade_events.sql.

-- The stream's kinds are the API's to check (`api/src/db/events.rs` reads each one it knows):
-- a CHECK made every new kind a rebuild of this table. SQLite cannot drop a CHECK constraint:
-- the table is made again without it, its triggers dropped first and made again after,
-- unchanged, for the last time.
DROP TRIGGER cluster_events_accepted;
DROP TRIGGER cluster_events_phase;
DROP TRIGGER cluster_events_node;
DROP TRIGGER cluster_events_report;
DROP TRIGGER cluster_events_remediation;
DROP TRIGGER cluster_events_snapshot_asked;
DROP TRIGGER cluster_events_snapshot_done;
DROP TRIGGER cluster_events_restore_started;
DROP TRIGGER cluster_events_restore_phase;
CREATE TABLE cluster_events_next (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    cluster_id  BIGINT  NOT NULL REFERENCES clusters (id) ON DELETE CASCADE,
    kind        TEXT    NOT NULL,
    vm_id       BIGINT,
    phase       TEXT    NOT NULL,
    state       TEXT,
    reason      TEXT,
    message     TEXT,
    snapshot_id BIGINT,
    created_at  BIGINT  NOT NULL
);
INSERT INTO cluster_events_next (id, cluster_id, kind, vm_id, phase, state, reason, message,
    snapshot_id, created_at)
SELECT id, cluster_id, kind, vm_id, phase, state, reason, message, snapshot_id, created_at
FROM cluster_events;
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

CREATE TRIGGER cluster_events_snapshot_asked AFTER INSERT ON snapshots
BEGIN
    INSERT INTO cluster_events (cluster_id, kind, vm_id, phase, message, snapshot_id, created_at)
    VALUES (NEW.cluster_id, 'snapshot',
        (SELECT vm_id FROM cluster_nodes WHERE id = NEW.node_id), 'requested',
        'asked of ' || NEW.member_name || ' (' || NEW.trigger || ')', NEW.id, NEW.requested_at);
END;

CREATE TRIGGER cluster_events_snapshot_done AFTER UPDATE OF state ON snapshots
WHEN NEW.state <> OLD.state
BEGIN
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
END;

CREATE TRIGGER cluster_events_restore_started AFTER INSERT ON restores
BEGIN
    INSERT INTO cluster_events (cluster_id, kind, phase, message, snapshot_id, created_at)
    VALUES (NEW.cluster_id, 'restore', NEW.phase,
        'restore ' || NEW.id || ' of snapshot ' || NEW.snapshot_id || ' of cluster '
            || NEW.source_cluster_id,
        NEW.snapshot_id, NEW.started_at);
END;

CREATE TRIGGER cluster_events_restore_phase AFTER UPDATE OF phase ON restores
WHEN NEW.phase <> OLD.phase
BEGIN
    INSERT INTO cluster_events (cluster_id, kind, phase, reason, message, snapshot_id,
        created_at)
    VALUES (NEW.cluster_id, 'restore', NEW.phase,
        CASE WHEN NEW.phase = 'failed' THEN 'RestoreFailed' END,
        CASE WHEN NEW.phase = 'failed' THEN NEW.error ELSE 'restore ' || NEW.id END,
        NEW.snapshot_id, NEW.updated_at);
END;

-- When the machine a remediation replaced was gone and its machine set back at its size with
-- every node up (the remediation's end); NULL while it runs.
ALTER TABLE remediations ADD COLUMN finished_at BIGINT;

-- A finished remediation is a change (kind 'remediation', `state` 'finished'; the one that
-- started it has no state).
CREATE TRIGGER cluster_events_remediation_finished AFTER UPDATE OF finished_at ON remediations
WHEN OLD.finished_at IS NULL AND NEW.finished_at IS NOT NULL
BEGIN
    INSERT INTO cluster_events (cluster_id, kind, vm_id, phase, state, reason, message,
        created_at)
    VALUES (NEW.cluster_id, 'remediation', NEW.vm_id,
        CASE WHEN NEW.pool_id IS NULL THEN 'control-plane' ELSE 'worker' END, 'finished',
        NEW.reason, NEW.node_name || ': replaced', NEW.finished_at);
END;

-- An upgrade's steps (kind 'upgrade'): the control plane's target changed ('started', the
-- message "from FROM to TO"), a member runs a new release ('member', at its report's time), every
-- member runs the target ('done'), a pool takes another release ('pool'). A member's first
-- release (its founding or its join) is not a step.
CREATE TRIGGER cluster_events_upgrade_started AFTER UPDATE OF kubernetes_version ON clusters
WHEN NEW.kubernetes_version IS NOT OLD.kubernetes_version
BEGIN
    INSERT INTO cluster_events (cluster_id, kind, phase, message, created_at)
    VALUES (NEW.id, 'upgrade', 'started',
        'from ' || OLD.kubernetes_version || ' to ' || NEW.kubernetes_version,
        NEW.updated_at);
END;

CREATE TRIGGER cluster_events_upgrade_member AFTER UPDATE OF kubernetes_version ON cluster_nodes
WHEN NEW.role = 'control-plane' AND OLD.kubernetes_version IS NOT NULL
    AND NEW.kubernetes_version IS NOT OLD.kubernetes_version
BEGIN
    INSERT INTO cluster_events (cluster_id, kind, vm_id, phase, message, created_at)
    VALUES (NEW.cluster_id, 'upgrade', NEW.vm_id, 'member',
        NEW.node_name || ' runs ' || NEW.kubernetes_version,
        COALESCE((SELECT MAX(created_at) FROM node_reports WHERE node_id = NEW.id),
            NEW.created_at));
    INSERT INTO cluster_events (cluster_id, kind, phase, message, created_at)
    SELECT c.id, 'upgrade', 'done',
        'every control-plane member runs ' || c.kubernetes_version,
        COALESCE((SELECT MAX(created_at) FROM node_reports WHERE node_id = NEW.id),
            NEW.created_at)
    FROM clusters c
    WHERE c.id = NEW.cluster_id AND c.kubernetes_version = NEW.kubernetes_version
      AND NOT EXISTS (SELECT 1 FROM cluster_nodes n WHERE n.cluster_id = c.id
          AND n.role = 'control-plane'
          AND (n.etcd_membership IS NULL OR n.etcd_membership <> 'leaving')
          AND (n.kubernetes_version IS NULL OR n.kubernetes_version <> c.kubernetes_version));
END;

CREATE TRIGGER cluster_events_upgrade_pool AFTER UPDATE OF kubernetes_version ON node_pools
WHEN NEW.kubernetes_version IS NOT OLD.kubernetes_version
BEGIN
    INSERT INTO cluster_events (cluster_id, kind, phase, message, created_at)
    VALUES (NEW.cluster_id, 'upgrade', 'pool',
        'pool ' || NEW.name || ' takes ' || NEW.kubernetes_version, NEW.updated_at);
END;
