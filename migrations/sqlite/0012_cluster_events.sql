-- A cluster's changes in order, for GET /clusters/{id}/events (Server-Sent Events resumed with
-- Last-Event-ID). Triggers write them, so every path that changes a cluster's phase, adds a
-- node or records a node's report is streamed without having to remember to.
CREATE TABLE cluster_events (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    cluster_id  BIGINT  NOT NULL REFERENCES clusters (id) ON DELETE CASCADE,
    kind        TEXT    NOT NULL CHECK (kind IN ('cluster', 'node', 'report')),
    vm_id       BIGINT,
    phase       TEXT    NOT NULL,
    state       TEXT,
    reason      TEXT,
    message     TEXT,
    created_at  BIGINT  NOT NULL
);
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
