-- Kubernetes versions per node and per pool, for upgrades (issue 44).
--
-- `clusters.kubernetes_version` is the control plane's target: the version a control-plane
-- node's next bundle renders. A node records the version of the last bundle it was handed
-- (`handed_version`) and, once it reports that bundle healthy, the version it runs
-- (`kubernetes_version`). A pool's workers render the pool's own version, which moves only
-- after the control plane's (the skew policy: no kubelet newer than an apiserver).
-- Keep equivalent to migrations/sqlite/0020_kubernetes_versions.sql.
ALTER TABLE cluster_nodes ADD COLUMN handed_version TEXT;
ALTER TABLE cluster_nodes ADD COLUMN kubernetes_version TEXT;
ALTER TABLE node_pools ADD COLUMN kubernetes_version TEXT;
-- A pool follows the control plane's release (its workers are replaced once every member runs
-- it) unless an operator pinned another with PATCH.
ALTER TABLE node_pools ADD COLUMN follow_control_plane INTEGER NOT NULL DEFAULT 1;

-- Every node and pool so far was made at its cluster's one version.
UPDATE cluster_nodes SET
    handed_version = CASE WHEN handed_generation > 0
        THEN (SELECT c.kubernetes_version FROM clusters c WHERE c.id = cluster_nodes.cluster_id)
        END,
    kubernetes_version = CASE WHEN applied_generation > 0
        THEN (SELECT c.kubernetes_version FROM clusters c WHERE c.id = cluster_nodes.cluster_id)
        END;
UPDATE node_pools SET
    kubernetes_version = (SELECT c.kubernetes_version FROM clusters c WHERE c.id = node_pools.cluster_id);
