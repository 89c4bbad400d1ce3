-- Operators may name their clusters (POST /clusters `name`); a name is unique in its org. A
-- row being inserted holds '' until it is named from its id in the same transaction.
CREATE UNIQUE INDEX clusters_org_name ON clusters (org_id, name) WHERE name <> '';
