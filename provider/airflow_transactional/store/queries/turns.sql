-- The turns table: whose turn it is (store/turns.py).

-- name: turn_ensure
INSERT INTO {s}.turns (name) VALUES (%(name)s) ON CONFLICT (name) DO NOTHING

-- name: turn_take
-- In the caller's transaction: waits for the turn, and holds it until that transaction ends.
SELECT name FROM {s}.turns WHERE name = %(name)s FOR UPDATE

-- name: turn_try
-- The turn now, or nothing when another transaction holds it.
SELECT name FROM {s}.turns WHERE name = %(name)s FOR UPDATE SKIP LOCKED
