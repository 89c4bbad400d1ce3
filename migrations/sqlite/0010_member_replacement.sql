-- A control-plane member the operator asked to replace (SQLite). Keep equivalent to
-- migrations/postgres/0010_member_replacement.sql. NULL: not being replaced; otherwise when the
-- replacement was asked (the API's clock). The replacement joins first and this member leaves
-- after it, unless this member is unhealthy: then it leaves first.
ALTER TABLE cluster_nodes ADD COLUMN replace_since INTEGER;
