-- Worker node pools (PostgreSQL). Keep equivalent to migrations/sqlite/0007_node_pools.sql.
-- A pool is a group of worker VMs alike: placement, and the labels and taints their kubelets
-- register their nodes with. A worker node row names its pool.
CREATE TABLE node_pools (
    id              BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    cluster_id      BIGINT  NOT NULL REFERENCES clusters (id) ON DELETE CASCADE,
    name            TEXT    NOT NULL,
    instance_type   TEXT    NOT NULL,
    image_id        BIGINT  NOT NULL,
    subnet_id       BIGINT  NOT NULL,
    labels_json     TEXT    NOT NULL DEFAULT '{}',
    taints_json     TEXT    NOT NULL DEFAULT '[]',
    desired_count   INTEGER NOT NULL CHECK (desired_count BETWEEN 0 AND 1000),
    created_at      BIGINT  NOT NULL,
    updated_at      BIGINT  NOT NULL,
    UNIQUE (cluster_id, name)
);
ALTER TABLE cluster_nodes ADD COLUMN pool_id BIGINT REFERENCES node_pools (id) ON DELETE CASCADE;
