-- GET /clusters pages through an org's clusters in id order: one index serves the filter and
-- the order (the org-only index it replaces made every page sort the whole org).
CREATE INDEX clusters_org_id ON clusters (org_id, id);
DROP INDEX clusters_org;
