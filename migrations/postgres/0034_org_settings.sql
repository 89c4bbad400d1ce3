-- An org's own settings, where it differs from the API's (PostgreSQL). Keep equivalent to
-- migrations/sqlite/0034_org_settings.sql.
-- keep_deleted_days: how long the org's deleted clusters are kept for recovery, instead of
-- `serve --keep-deleted-days` (`exk8s-api orgs set --keep-deleted-days`). A cluster's
-- kept_until is fixed at its delete: a later change applies to later deletes.
CREATE TABLE org_settings (
    org_id             BIGINT  PRIMARY KEY,
    keep_deleted_days  INTEGER CHECK (keep_deleted_days BETWEEN 0 AND 3650),
    updated_at         BIGINT  NOT NULL
);
