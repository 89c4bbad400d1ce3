-- How many workers a pool makes beyond its count while it replaces workers of another
-- release (Cluster API's MachineDeployment `maxSurge`; `maxUnavailable` is always 0 here).
-- Every pool so far replaced one at a time.
ALTER TABLE node_pools ADD COLUMN max_surge INTEGER NOT NULL DEFAULT 1;
