-- Service-account signing key rotation (PostgreSQL). Keep equivalent to
-- migrations/sqlite/0024_sa_key_rotation.sql.
-- A rotation moves through `phase`: 'trust-both' (every apiserver verifies with the old and the
-- new public key; the old key still signs; the new key waits sealed in `new_key_sealed`),
-- 'sign-new' (the new key is the cluster's and signs; the old public key, `other_public`, is
-- still trusted; `signing_since` is when every control-plane node applied that, and the old key
-- is dropped `drop_old_after` seconds later), 'drop-old' (only the new public key is trusted);
-- then the row goes. One rotation of a cluster's key at a time.
CREATE TABLE sa_key_rotations (
    cluster_id      BIGINT  PRIMARY KEY REFERENCES clusters (id) ON DELETE CASCADE,
    phase           TEXT    NOT NULL CHECK (phase IN ('trust-both', 'sign-new', 'drop-old')),
    other_public    TEXT,
    new_key_sealed  TEXT,
    drop_old_after  BIGINT  NOT NULL CHECK (drop_old_after >= 0),
    signing_since   BIGINT,
    started_at      BIGINT  NOT NULL,
    updated_at      BIGINT  NOT NULL
);
-- When the cluster's service-account key was made (NULL: at the cluster's creation), how old it
-- may grow before the ServiceAccountKeyFresh condition turns False, and whether the reconciler
-- then rotates it by itself (1) or only warns (0).
ALTER TABLE clusters ADD COLUMN sa_key_created_at BIGINT;
ALTER TABLE clusters ADD COLUMN sa_key_max_age_days BIGINT NOT NULL DEFAULT 365
    CHECK (sa_key_max_age_days >= 1);
ALTER TABLE clusters ADD COLUMN sa_key_auto_rotate INTEGER NOT NULL DEFAULT 0
    CHECK (sa_key_auto_rotate IN (0, 1));
