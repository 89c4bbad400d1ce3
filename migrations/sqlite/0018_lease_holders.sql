-- Who holds a lease: a lease is short and renewed by its holder while it works, so a crashed
-- holder's change is taken over within seconds; the holder column makes renewing and releasing
-- conditional on still holding it (a paused process cannot extend a lease another took).
ALTER TABLE clusters ADD COLUMN membership_lease_holder TEXT;
ALTER TABLE node_pools ADD COLUMN lease_holder TEXT;
