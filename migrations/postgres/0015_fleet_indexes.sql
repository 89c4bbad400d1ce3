-- Indexes that keep per-request cost flat as the fleet grows (issue 21, Build 4).
--
-- The key pool asks, on every reconciler pass, which nodes will soon ask for a bundle: those
-- not yet handed their desired generation. Few nodes are, most of the time; a partial index
-- keeps that question from reading every node of the fleet.
CREATE INDEX cluster_nodes_pending ON cluster_nodes (cluster_id)
    WHERE handed_generation < desired_generation;
-- Every control-plane bundle asks which workers its agent drains, and a worker's bundle or its
-- pool's convergence reads the pool's nodes: without these, each read every node of the fleet.
CREATE INDEX cluster_nodes_drain_by ON cluster_nodes (drain_by) WHERE drain_by IS NOT NULL;
CREATE INDEX cluster_nodes_pool ON cluster_nodes (pool_id) WHERE pool_id IS NOT NULL;
