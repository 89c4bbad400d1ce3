-- Per-node pod ranges (SQLite). Keep equivalent to migrations/postgres/0006_pod_ranges.sql.
-- Each node owns one block of its cluster's pod CIDR (a /24 of IPv4, a /64 of IPv6), by index:
-- unique per cluster, released with the node's row. Nodes made before get their ordinal's.
ALTER TABLE cluster_nodes ADD COLUMN pod_range INTEGER CHECK (pod_range >= 0);
UPDATE cluster_nodes SET pod_range = ordinal - 1;
CREATE UNIQUE INDEX cluster_nodes_pod_range ON cluster_nodes (cluster_id, pod_range);
