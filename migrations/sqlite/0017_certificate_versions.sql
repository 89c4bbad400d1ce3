-- A cluster's own certificates (its CAs, the operator kubeconfig) change its version: every
-- write to its node-less rows of issued_certificates adds one, in the same transaction. A
-- node's rows change only with the node's bundle serial. Together they stamp what the API
-- keeps of a cluster's certificates in memory, and a copy is used only while its stamp holds.
ALTER TABLE clusters ADD COLUMN certificates_version BIGINT NOT NULL DEFAULT 0;
