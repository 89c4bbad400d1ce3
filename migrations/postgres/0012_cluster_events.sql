-- A cluster's changes in order, for GET /clusters/{id}/events (Server-Sent Events resumed with
-- Last-Event-ID). Triggers write them, so every path that changes a cluster's phase, adds a
-- node or records a node's report is streamed without having to remember to.
CREATE TABLE cluster_events (
    id          BIGSERIAL PRIMARY KEY,
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

CREATE FUNCTION cluster_events_cluster() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' OR NEW.phase IS DISTINCT FROM OLD.phase THEN
        INSERT INTO cluster_events (cluster_id, kind, phase, reason, message, created_at)
        VALUES (NEW.id, 'cluster', NEW.phase, NEW.error_reason, NEW.error_message, NEW.updated_at);
    END IF;
    RETURN NULL;
END;
$$;
CREATE TRIGGER cluster_events_phase AFTER INSERT OR UPDATE OF phase ON clusters
FOR EACH ROW EXECUTE FUNCTION cluster_events_cluster();

CREATE FUNCTION cluster_events_node() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO cluster_events (cluster_id, kind, vm_id, phase, created_at)
    VALUES (NEW.cluster_id, 'node', NEW.vm_id, NEW.phase, NEW.created_at);
    RETURN NULL;
END;
$$;
CREATE TRIGGER cluster_events_node AFTER INSERT ON cluster_nodes
FOR EACH ROW EXECUTE FUNCTION cluster_events_node();

CREATE FUNCTION cluster_events_report() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO cluster_events (cluster_id, kind, vm_id, phase, state, message, created_at)
    SELECT cluster_id, 'report', vm_id, NEW.phase, NEW.state, NEW.message, NEW.created_at
    FROM cluster_nodes WHERE id = NEW.node_id;
    RETURN NULL;
END;
$$;
CREATE TRIGGER cluster_events_report AFTER INSERT ON node_reports
FOR EACH ROW EXECUTE FUNCTION cluster_events_report();
