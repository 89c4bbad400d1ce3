-- Certificates as issued (SQLite). Keep equivalent to migrations/postgres/0004_certificates.sql.
-- Every certificate the API makes is recorded when it makes it: the inventory and the renewal
-- policy read these rows, never a node's disk. A node's rows carry the generation whose bundle
-- held them; a cluster's own rows (its CAs, operator kubeconfigs) have no node.
CREATE TABLE issued_certificates (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    cluster_id  BIGINT  NOT NULL REFERENCES clusters (id) ON DELETE CASCADE,
    node_id     BIGINT  REFERENCES cluster_nodes (id) ON DELETE CASCADE,
    generation  BIGINT  NOT NULL DEFAULT 0 CHECK (generation >= 0),
    name        TEXT    NOT NULL,
    kind        TEXT    NOT NULL CHECK (kind IN ('ca', 'serving', 'client')),
    subject     TEXT    NOT NULL,
    issuer      TEXT    NOT NULL,
    serial      TEXT    NOT NULL,
    not_before  BIGINT  NOT NULL,
    not_after   BIGINT  NOT NULL CHECK (not_after > not_before),
    created_at  BIGINT  NOT NULL
);
CREATE INDEX issued_certificates_node ON issued_certificates (cluster_id, node_id, generation);
