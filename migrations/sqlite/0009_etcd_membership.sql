-- A control-plane node's place in etcd (SQLite). Keep equivalent to
-- migrations/postgres/0009_etcd_membership.sql. `voter` (every founding member), `joining`
-- (added after founding, not promoted yet) or `leaving`; NULL for workers, which run no etcd.
ALTER TABLE cluster_nodes ADD COLUMN etcd_membership TEXT
    CHECK (etcd_membership IN ('voter', 'joining', 'leaving'));
UPDATE cluster_nodes SET etcd_membership = 'voter' WHERE role = 'control-plane';
-- The control-plane size the operator asked for (NULL: as founded), the one API process
-- changing the membership (lease), why the last change failed, and when a join started.
ALTER TABLE clusters ADD COLUMN desired_control_plane_count INTEGER
    CHECK (desired_control_plane_count IN (1, 3, 5, 7));
ALTER TABLE clusters ADD COLUMN membership_lease_until BIGINT;
ALTER TABLE clusters ADD COLUMN membership_error TEXT;
