-- The write probe behind /readyz: one row per API process, rewritten on every check.
CREATE TABLE readiness_probe (
    id          BIGINT  PRIMARY KEY,
    payload     TEXT    NOT NULL,
    checked_at  BIGINT  NOT NULL
);
