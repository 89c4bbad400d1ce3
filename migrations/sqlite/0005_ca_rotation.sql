-- CA rotation (SQLite). Keep equivalent to migrations/postgres/0005_ca_rotation.sql.
-- At most one rotation per cluster at a time, moving through three phases, each delivered to
-- every node as a generation before the next starts: trust-both (trust files carry the old
-- and the new CA; the old one still signs), sign-new (the new CA signs, the old one is still
-- trusted), drop-old (only the new CA is trusted). other_cert is the CA certificate trusted
-- beside the cluster's current one: the new CA in trust-both, the old one in sign-new. The new
-- CA's key waits here, sealed, until it starts signing.
CREATE TABLE ca_rotations (
    cluster_id      BIGINT  PRIMARY KEY REFERENCES clusters (id) ON DELETE CASCADE,
    ca              TEXT    NOT NULL CHECK (ca IN ('cluster', 'etcd', 'front-proxy')),
    phase           TEXT    NOT NULL CHECK (phase IN ('trust-both', 'sign-new', 'drop-old')),
    other_cert      TEXT,
    new_key_sealed  TEXT,
    started_at      BIGINT  NOT NULL,
    updated_at      BIGINT  NOT NULL
);
