-- A control-plane node's place in etcd (SQLite). Keep equivalent to
-- migrations/postgres/0009_etcd_membership.sql. `voter` (every founding member), `joining`
-- (added after founding, not promoted yet) or `leaving`; NULL for workers, which run no etcd.
ALTER TABLE cluster_nodes ADD COLUMN etcd_membership TEXT
    CHECK (etcd_membership IN ('voter', 'joining', 'leaving'));
UPDATE cluster_nodes SET etcd_membership = 'voter' WHERE role = 'control-plane';
