-- Each node component's health as the node's agent last reported it (probes during its boot
-- and at every sync): the per-node conditions (EtcdMemberHealthy, APIServerPodHealthy, …) and
-- the cluster's (Available, EtcdClusterHealthy, ControlPlaneComponentsHealthy) are read from
-- here. `changed_at` is when `healthy` last changed (lastTransitionTime).
CREATE TABLE node_components (
    node_id     BIGINT  NOT NULL REFERENCES cluster_nodes (id) ON DELETE CASCADE,
    component   TEXT    NOT NULL CHECK (component IN
                    ('etcd', 'kube-apiserver', 'kube-controller-manager', 'kube-scheduler', 'kubelet')),
    healthy     INTEGER NOT NULL CHECK (healthy IN (0, 1)),
    message     TEXT    NOT NULL,
    changed_at  BIGINT  NOT NULL,
    reported_at BIGINT  NOT NULL,
    PRIMARY KEY (node_id, component)
);
