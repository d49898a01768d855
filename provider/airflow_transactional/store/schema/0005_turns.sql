-- Turns: one row per thing whose runs take turns -- an output's publisher, a decision's
-- completions, a rebuild's liveness. Holding the row's lock is holding the turn. An advisory lock
-- served before; but any role may take any advisory lock, and their keys followed from public
-- names: a producer held one and stalled a topology's decisions and publishing. Only the roles
-- granted UPDATE here (the owner, the run-time role) can lock these rows.
CREATE TABLE {s}.turns (name text PRIMARY KEY);
