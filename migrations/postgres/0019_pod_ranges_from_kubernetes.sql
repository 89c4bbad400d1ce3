-- Pod ranges come from Kubernetes now (the controller-manager's node IPAM gives each Node its
-- block of the pod CIDR), not from the API: the per-node index and its unique index go.
-- Keep equivalent to migrations/sqlite/0019_pod_ranges_from_kubernetes.sql.
DROP INDEX cluster_nodes_pod_range;
ALTER TABLE cluster_nodes DROP COLUMN pod_range;
