-- What a cluster's certificates were before and its CA rotations that ended, for the timeline of
-- certificates (the console's): `issued_certificates` holds only what runs now (SQLite).
-- Keep equivalent to migrations/postgres/0032_certificate_history.sql.

-- A certificate's life that ended: a node's generation once the node applied a newer one, or a
-- cluster's own certificate once replaced (`superseded_at`). The last few per node and name.
CREATE TABLE certificate_history (
    id             INTEGER PRIMARY KEY AUTOINCREMENT,
    cluster_id     BIGINT  NOT NULL REFERENCES clusters (id) ON DELETE CASCADE,
    node_id        BIGINT  REFERENCES cluster_nodes (id) ON DELETE CASCADE,
    generation     BIGINT  NOT NULL,
    name           TEXT    NOT NULL,
    kind           TEXT    NOT NULL,
    subject        TEXT    NOT NULL,
    issuer         TEXT    NOT NULL,
    serial         TEXT    NOT NULL,
    not_before     BIGINT  NOT NULL,
    not_after      BIGINT  NOT NULL,
    superseded_at  BIGINT  NOT NULL
);
CREATE INDEX certificate_history_of ON certificate_history (cluster_id, node_id, name, id);

-- A CA rotation, from its start to its end: when it entered each phase. The row of a rotation
-- under way has no `finished_at`. The last few per cluster.
CREATE TABLE ca_rotation_history (
    id           INTEGER PRIMARY KEY AUTOINCREMENT,
    cluster_id   BIGINT  NOT NULL REFERENCES clusters (id) ON DELETE CASCADE,
    ca           TEXT    NOT NULL,
    started_at   BIGINT  NOT NULL,
    sign_new_at  BIGINT,
    drop_old_at  BIGINT,
    finished_at  BIGINT
);
CREATE INDEX ca_rotation_history_of ON ca_rotation_history (cluster_id, id);
