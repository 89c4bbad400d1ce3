-- A node's rows from earlier bundles of the same generation were never read: the inventory
-- takes the latest row per name of a generation. Issuance now replaces them; this drops the
-- ones kept before (a node that fetched its bundle 10,000 times held 10,000 bundles' rows).
DELETE FROM issued_certificates
WHERE node_id IS NOT NULL AND EXISTS (
    SELECT 1 FROM issued_certificates newer
    WHERE newer.cluster_id = issued_certificates.cluster_id
      AND newer.node_id = issued_certificates.node_id
      AND newer.generation = issued_certificates.generation
      AND newer.name = issued_certificates.name
      AND newer.id > issued_certificates.id);
