-- Snapshots and restores on the cluster's stream (SQLite). Keep equivalent to
-- migrations/postgres/0030_snapshot_restore_events.sql.
-- When a snapshot was stored or failed.
ALTER TABLE snapshots ADD COLUMN finished_at BIGINT;

-- Every snapshot is a change when it is asked for and again when it is stored or fails (kind
-- 'snapshot'; `phase` its state, `snapshot_id` which one, `vm_id` the member asked); so is
-- every restore as it enters each of its phases (kind 'restore'; `snapshot_id` the snapshot it
-- restores). SQLite
-- cannot change a CHECK constraint: the table is made again, its triggers dropped first and made
-- again after, unchanged.
DROP TRIGGER cluster_events_accepted;
DROP TRIGGER cluster_events_phase;
DROP TRIGGER cluster_events_node;
DROP TRIGGER cluster_events_report;
DROP TRIGGER cluster_events_remediation;
CREATE TABLE cluster_events_next (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    cluster_id  BIGINT  NOT NULL REFERENCES clusters (id) ON DELETE CASCADE,
    kind        TEXT    NOT NULL CHECK (kind IN ('cluster', 'node', 'report', 'remediation', 'snapshot',
        'restore')),
    vm_id       BIGINT,
    phase       TEXT    NOT NULL,
    state       TEXT,
    reason      TEXT,
    message     TEXT,
    snapshot_id BIGINT,
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
