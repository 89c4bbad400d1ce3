-- The health passes' watch (sqlite). Keep equivalent to migrations/postgres/0028_health_watch.sql.
-- When a health pass last ran, any replica's (one row, id 1): a pass that finds it older than
-- the watch's gap (the API was away, or paused) resumes the watch.
CREATE TABLE health_watch (
    id           INTEGER PRIMARY KEY,
    last_pass_at BIGINT NOT NULL
);
-- The earliest moment a node's silence counts from: when the health passes last resumed after
-- a gap. While no API ran, no poll could be heard, so a node is never judged unreachable for
-- a silence the API was not there to hear. NULL: the watch has not resumed since the node was made.
ALTER TABLE cluster_nodes ADD COLUMN silence_counts_from BIGINT;
