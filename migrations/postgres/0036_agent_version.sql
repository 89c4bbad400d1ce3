-- The release of the agent each node last fetched a bundle with (PostgreSQL). Keep equivalent to
-- migrations/sqlite/0036_agent_version.sql.
-- agent_version: what its User-Agent said ("exk8s-agent/<version>"), the version only; NULL
-- until its next bundle fetch, and for agents that never said. Additive: binaries of
-- migration 0035 run beside it (docs/upgrading-exk8s.md, "Migrations").
ALTER TABLE cluster_nodes ADD COLUMN agent_version TEXT;
