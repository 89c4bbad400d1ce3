-- The key pool asks, on every reconciler pass, which nodes will soon ask for a bundle: those
-- not yet handed their desired generation. Few nodes are, most of the time; a partial index
-- keeps that question from reading every node of the fleet.
CREATE INDEX cluster_nodes_pending ON cluster_nodes (cluster_id)
    WHERE handed_generation < desired_generation;
