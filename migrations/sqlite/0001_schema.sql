-- exk8s schema (SQLite). Keep equivalent to migrations/postgres/0001_schema.sql.
-- Timestamps are unix seconds (BIGINT); booleans are 0/1 integers; secrets are sealed text.

CREATE TABLE api_tokens (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    token_hash  TEXT    NOT NULL UNIQUE,
    org_id      BIGINT  NOT NULL,
    principal   TEXT    NOT NULL,
    scope       TEXT    NOT NULL CHECK (scope IN ('operator', 'bootstrap')),
    created_at  BIGINT  NOT NULL,
    expires_at  BIGINT  NOT NULL,
    revoked     INTEGER NOT NULL DEFAULT 0
);

CREATE TABLE imds_tokens (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    token_hash  TEXT    NOT NULL UNIQUE,
    vm_id       BIGINT  NOT NULL,
    org_id      BIGINT  NOT NULL,
    created_at  BIGINT  NOT NULL,
    expires_at  BIGINT  NOT NULL
);

CREATE TABLE clusters (
    id                      INTEGER PRIMARY KEY AUTOINCREMENT,
    org_id                  BIGINT  NOT NULL,
    name                    TEXT    NOT NULL,
    phase                   TEXT    NOT NULL,
    spec_json               TEXT    NOT NULL,
    key_algorithm           TEXT    NOT NULL,
    kubernetes_version      TEXT    NOT NULL,
    service_cidr            TEXT    NOT NULL,
    pod_cidr                TEXT    NOT NULL,
    cluster_domain          TEXT    NOT NULL,
    control_plane_dns_name  TEXT    NOT NULL,
    ca_cert                 TEXT,
    ca_key_sealed           TEXT,
    etcd_ca_cert            TEXT,
    etcd_ca_key_sealed      TEXT,
    front_proxy_ca_cert     TEXT,
    front_proxy_ca_key_sealed TEXT,
    sa_public               TEXT,
    sa_key_sealed           TEXT,
    encryption_key_sealed   TEXT,
    security_group_id       BIGINT,
    dns_configured          INTEGER NOT NULL DEFAULT 0,
    dns_error               TEXT,
    error_reason            TEXT,
    error_message           TEXT,
    created_at              BIGINT  NOT NULL,
    updated_at              BIGINT  NOT NULL
);
CREATE INDEX clusters_org ON clusters (org_id);
CREATE INDEX clusters_phase ON clusters (phase, updated_at);

CREATE TABLE cluster_nodes (
    id              INTEGER PRIMARY KEY AUTOINCREMENT,
    cluster_id      BIGINT  NOT NULL REFERENCES clusters (id) ON DELETE CASCADE,
    ordinal         INTEGER NOT NULL,
    vm_id           BIGINT  NOT NULL UNIQUE,
    node_name       TEXT    NOT NULL,
    private_ipv4    TEXT    NOT NULL,
    private_ipv6    TEXT,
    public_ipv4     TEXT,
    is_initial      INTEGER NOT NULL,
    serial          BIGINT  NOT NULL DEFAULT 0,
    issuance_allowed INTEGER NOT NULL DEFAULT 1,
    phase           TEXT    NOT NULL DEFAULT 'pending',
    created_at      BIGINT  NOT NULL,
    UNIQUE (cluster_id, ordinal)
);

-- The two control-plane facets of one machine: stacked etcd member and apiserver host.
CREATE TABLE etcd_members (
    node_id         BIGINT PRIMARY KEY REFERENCES cluster_nodes (id) ON DELETE CASCADE,
    server_cert     TEXT NOT NULL,
    server_key_sealed TEXT NOT NULL,
    peer_cert       TEXT NOT NULL,
    peer_key_sealed TEXT NOT NULL
);

CREATE TABLE apiserver_nodes (
    node_id         BIGINT PRIMARY KEY REFERENCES cluster_nodes (id) ON DELETE CASCADE,
    serving_cert    TEXT NOT NULL,
    serving_key_sealed TEXT NOT NULL
);

-- Every external thing founding creates, journaled before the call and updated after it.
CREATE TABLE cluster_resources (
    id              INTEGER PRIMARY KEY AUTOINCREMENT,
    cluster_id      BIGINT  NOT NULL,
    kind            TEXT    NOT NULL CHECK (kind IN ('vm', 'security_group', 'dns_record')),
    client_token    TEXT    NOT NULL UNIQUE,
    external_id     TEXT,
    ordinal         INTEGER,
    state           TEXT    NOT NULL,
    created_at      BIGINT  NOT NULL,
    updated_at      BIGINT  NOT NULL
);
CREATE INDEX cluster_resources_cluster ON cluster_resources (cluster_id);

CREATE TABLE bundle_issuances (
    id              INTEGER PRIMARY KEY AUTOINCREMENT,
    vm_id           BIGINT  NOT NULL,
    cluster_id      BIGINT,
    serial          BIGINT,
    bundle_id       TEXT,
    bundle_sha256   TEXT,
    key_id          TEXT,
    outcome         TEXT    NOT NULL,
    reason          TEXT,
    source_address  TEXT,
    created_at      BIGINT  NOT NULL
);
CREATE INDEX bundle_issuances_vm ON bundle_issuances (vm_id);

CREATE TABLE node_reports (
    id              INTEGER PRIMARY KEY AUTOINCREMENT,
    node_id         BIGINT  NOT NULL REFERENCES cluster_nodes (id) ON DELETE CASCADE,
    phase           TEXT    NOT NULL,
    state           TEXT    NOT NULL,
    message         TEXT    NOT NULL,
    created_at      BIGINT  NOT NULL
);
CREATE INDEX node_reports_node ON node_reports (node_id);

CREATE TABLE idempotency_keys (
    org_id          BIGINT  NOT NULL,
    idem_key        TEXT    NOT NULL,
    request_sha256  TEXT    NOT NULL,
    state           TEXT    NOT NULL,
    status_code     INTEGER,
    response_sealed TEXT,
    created_at      BIGINT  NOT NULL,
    PRIMARY KEY (org_id, idem_key)
);
