-- Which exk8s-api binaries may run against this schema (SQLite). Keep equivalent to
-- migrations/postgres/0035_schema_compatibility.sql.
-- A binary starts only when it knows every migration up to oldest_binary_migration (the
-- version of the newest migration it must know); it ignores applied migrations newer than its
-- own, which the release policy keeps additive (docs/upgrading-exk8s.md, "Migrations"). A
-- migration that older binaries cannot run against raises this floor in the same file, and
-- they then refuse to start with the versions named, instead of failing on a query later.
CREATE TABLE schema_compatibility (
    id                       INTEGER PRIMARY KEY CHECK (id = 1),
    oldest_binary_migration  BIGINT  NOT NULL
);
-- 0035 is the first release that runs against a newer schema: every binary before it refuses
-- migrations it does not know.
INSERT INTO schema_compatibility (id, oldest_binary_migration) VALUES (1, 35);
