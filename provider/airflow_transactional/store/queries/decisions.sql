-- Decisions in commit order (DecisionSpec): the requests an attempt staged, recorded when it
-- completes (decision_prepare_*) and decided per key inside the commit (decision_decide_*). The
-- order the statements run in, and why, is in store/decisions.py. {staging}, {runs}: the
-- decision's tables of one topology; {keys}: the state's key columns; {fresh}, {fix}, {decided}:
-- this transaction's temporary tables. Parameters: t (topology), d (decision), txid, attempt.

-- name: decision_staging_create
-- The key refuses one attempt deciding a request id twice (processors keep the first).
CREATE TABLE IF NOT EXISTS {staging} (txid bigint NOT NULL, attempt integer NOT NULL, {key_defs},
    seq bigint, request text NOT NULL, amount {value_type} NOT NULL, PRIMARY KEY (txid, attempt, request))

-- name: decision_runs_create
-- Per completed attempt and key, its run of requests. low: the run's lowest sum after a debit
-- (NULL: no debit); every request is granted when the start balance plus low is at or above the
-- floor. high: the highest sum of a debit and the credits before it; every debit is declined
-- (every credit granted) when the start balance plus high is below the floor. credits, debits:
-- their sum and count.
CREATE TABLE IF NOT EXISTS {runs} (txid bigint NOT NULL, attempt integer NOT NULL, {key_defs},
    requests text[] NOT NULL, amounts numeric[] NOT NULL, total numeric NOT NULL, low numeric,
    high numeric, credits numeric, debits integer, PRIMARY KEY (txid, attempt, {keys}))

-- name: decision_prepare_fresh_create
CREATE TEMP TABLE {fresh} ({key_defs}, request text, seq bigint, amount numeric, prefix numeric,
    cprefix numeric, keep boolean, earlier boolean, later boolean) ON COMMIT DROP

-- name: decision_prepare_fresh
-- Per request, one probe of each table finds every other txid that claims it: recorded by a
-- committed txid (decided: left out), claimed by an earlier uncommitted one (left out for now, a
-- conflict the commit settles), or by a later one (a conflict of that txid). prefix, cprefix: the
-- running sum of the kept requests, and of their credits, in the key's order.
INSERT INTO {fresh}
SELECT {keys}, request, seq, amount,
       sum(amount) FILTER (WHERE keep) OVER w, sum(amount) FILTER (WHERE keep AND amount >= 0) OVER w,
       keep, earlier AND NOT decided, later AND NOT decided
FROM (SELECT y.*, NOT decided AND NOT earlier AS keep
      FROM (SELECT r.*, coalesce(c.decided, false) AS decided, coalesce(c.earlier, false) AS earlier,
                   coalesce(c.later, false) AS later
            FROM {staging} r,
            LATERAL (SELECT bool_or(o.recorded AND o.txid <= %(c)s) AS decided,
                            bool_or(o.txid > %(c)s AND o.txid < %(txid)s) AS earlier,
                            bool_or(o.txid > %(txid)s) AS later
                     FROM ({claims}) o) c
            WHERE r.txid = %(txid)s AND r.attempt = %(attempt)s) y) x
WINDOW w AS (PARTITION BY {keys} ORDER BY seq, request)

-- name: decision_claims
-- Every attempt that claims {request} with a txid matching {txids}: it recorded the request, or
-- left it out only for a conflict its commit settles (c: the committed txid).
SELECT o.request_id, o.txid, o.attempt, o.seq, o.key, o.amount, true AS recorded
FROM {s}.decision_requests o
WHERE o.topology_id = %(t)s AND o.decision = %(d)s AND o.request_id = {request} AND o.txid {txids}
UNION ALL
SELECT o.request_id, o.txid, o.attempt, o.seq, o.key, o.amount, false
FROM {s}.decision_conflicts o
WHERE o.topology_id = %(t)s AND o.decision = %(d)s AND o.request_id = {request} AND o.txid {txids}
  AND o.txid > %(c)s

-- name: decision_prepare_record
INSERT INTO {s}.decision_requests (topology_id, decision, request_id, txid, attempt, seq, key, amount, prefix, cprefix)
SELECT %(t)s, %(d)s, request, %(txid)s, %(attempt)s, seq, jsonb_build_array({keys}), amount, prefix, cprefix
FROM {fresh} WHERE keep ORDER BY request

-- name: decision_prepare_runs
INSERT INTO {runs} (txid, attempt, {keys}, requests, amounts, total, low, high, credits, debits)
SELECT %(txid)s, %(attempt)s, {keys}, array_agg(request ORDER BY seq, request), array_agg(amount ORDER BY seq, request),
       sum(amount), min(prefix) FILTER (WHERE amount < 0), max(coalesce(cprefix, 0) + amount) FILTER (WHERE amount < 0),
       coalesce(sum(amount) FILTER (WHERE amount >= 0), 0), count(*) FILTER (WHERE amount < 0)
FROM {fresh} WHERE keep GROUP BY {keys}

-- name: decision_prepare_conflicts
-- Conflicts (usually none): this attempt's requests an earlier txid claims, and the claims of
-- later txids on requests this one claims.
INSERT INTO {s}.decision_conflicts (topology_id, decision, request_id, txid, attempt, seq, key, amount)
SELECT %(t)s, %(d)s, request, %(txid)s, %(attempt)s, seq, jsonb_build_array({keys}), amount FROM {fresh} WHERE earlier
UNION ALL
SELECT %(t)s, %(d)s, o.request_id, o.txid, o.attempt, o.seq, o.key, o.amount FROM {fresh} f, LATERAL ({claims}) o
WHERE f.later
ON CONFLICT DO NOTHING

-- name: decision_prepare_checked
-- The staged rows go; how many there were stays, for the commit's count check.
WITH gone AS (DELETE FROM {staging} WHERE txid = %(txid)s AND attempt = %(attempt)s RETURNING 1)
INSERT INTO {s}.decision_checks (topology_id, decision, txid, attempt, checked_through, staged)
SELECT %(t)s, %(d)s, %(txid)s, %(attempt)s, %(c)s, count(*) FROM gone

-- name: decision_prepare_forget_committed
-- What committed txids left behind (runs, requests of attempts that never completed) is no longer
-- read: the next attempt to complete clears it, off the commit's path.
DELETE FROM {runs} WHERE txid <= %(c)s;
DELETE FROM {staging} WHERE txid <= %(c)s;
DELETE FROM {s}.decision_checks WHERE topology_id = %(t)s AND decision = %(d)s AND txid <= %(c)s;
DELETE FROM {s}.decision_conflicts WHERE topology_id = %(t)s AND decision = %(d)s AND txid <= %(c)s

-- name: decision_checked_count
SELECT staged FROM {s}.decision_checks
WHERE topology_id = %(t)s AND decision = %(d)s AND txid = %(txid)s AND attempt = %(attempt)s

-- name: decision_staged_count
SELECT count(*) FROM {staging} WHERE txid = %(txid)s AND attempt = %(attempt)s

-- name: decision_runs_of_attempt
-- The runs of this attempt, as the commit decides them (must_loop: decide request by request).
SELECT {k_keys}, k.requests, k.amounts, k.total, k.low, k.high, k.credits, k.debits, false AS must_loop
FROM {runs} k WHERE k.txid = %(txid)s AND k.attempt = %(attempt)s

-- name: decision_decide_fix_create
-- The conflicts found when attempts completed, settled now that every earlier txid is committed:
-- a request one of them decided (recorded but decided: take out), or one none of them decided (not
-- recorded and not decided: put back). OFFSET 0 keeps each probe a probe.
CREATE TEMP TABLE {fix} ON COMMIT DROP AS
SELECT request_id::text AS request, key, seq, amount, recorded
FROM (SELECT c.*,
             EXISTS (SELECT 1 FROM {s}.decision_requests m WHERE m.topology_id = %(t)s AND m.decision = %(d)s
                     AND m.request_id = c.request_id AND m.txid = %(txid)s AND m.attempt = %(attempt)s
                     OFFSET 0) AS recorded,
             EXISTS (SELECT 1 FROM {s}.decision_requests o WHERE o.topology_id = %(t)s AND o.decision = %(d)s
                     AND o.request_id = c.request_id AND o.txid < %(txid)s OFFSET 0) AS decided
      FROM {s}.decision_conflicts c
      WHERE c.topology_id = %(t)s AND c.decision = %(d)s AND c.txid = %(txid)s AND c.attempt = %(attempt)s) x
WHERE recorded = decided

-- name: decision_decide_fix_requests
DELETE FROM {s}.decision_requests r USING {fix} f
WHERE r.topology_id = %(t)s AND r.decision = %(d)s AND r.request_id = f.request AND r.txid = %(txid)s
  AND r.attempt = %(attempt)s AND f.recorded;
INSERT INTO {s}.decision_requests (topology_id, decision, request_id, txid, attempt, seq, key, amount, prefix)
SELECT %(t)s, %(d)s, request, %(txid)s, %(attempt)s, seq, key, amount, 0 FROM {fix} WHERE NOT recorded

-- name: decision_runs_with_fixes
-- The runs of this attempt, the keys of a settled conflict rebuilt from their requests (the ones
-- recorded and the ones put back) to be decided request by request.
{runs_of_attempt} AND NOT jsonb_build_array({k_keys}) IN (SELECT key FROM {fix})
UNION ALL
SELECT {typed_keys}, array_agg(m.request ORDER BY m.seq, m.request COLLATE "default"),
       array_agg(m.amount ORDER BY m.seq, m.request COLLATE "default"), sum(m.amount), NULL, NULL, NULL, NULL, true
FROM (SELECT jsonb_build_array({k_keys}) AS key, u.request, u.amount, r.seq
      FROM {runs} k, unnest(k.requests, k.amounts) AS u(request, amount), {s}.decision_requests r
      WHERE k.txid = %(txid)s AND k.attempt = %(attempt)s AND jsonb_build_array({k_keys}) IN (SELECT key FROM {fix})
        AND r.topology_id = %(t)s AND r.decision = %(d)s AND r.request_id = u.request AND r.txid = %(txid)s
        AND r.attempt = %(attempt)s
      UNION ALL
      SELECT key, request, amount, seq FROM {fix} WHERE NOT recorded) m
GROUP BY m.key

-- name: decision_headroom
-- What the headroom relation adds to a key's balance (row r).
coalesce((SELECT sum(h.value) FROM {headroom} h WHERE {h_is_r}), 0)

-- name: decision_decide_create
CREATE TEMP TABLE {decided} ({key_defs}, start numeric, requests text[], grants boolean[], balances numeric[],
    delta numeric, granted integer, declined integer, debits_declined boolean, amounts numeric[]) ON COMMIT DROP

-- name: decision_decide
-- Per key: its run granted whole, every debit declined, or else the loop (guarded_run), which alone
-- has a call (a gating condition). A balance stays at or above the floor (lo), and within what the
-- state's type holds (low .. high): a credit that would carry it past the top (hi) is declined, so
-- no request can make the commit's arithmetic fail; the fast ways are taken only when even every
-- credit granted stays below it. declines: keep the requests of a key whose debits were all
-- declined, for the output append.
INSERT INTO {decided}
SELECT {r_keys}, r.start,
       CASE WHEN r.kind = 'loop' OR %(declines)s AND r.kind = 'none' THEN r.requests END,
       g.grants, g.balances,
       CASE r.kind WHEN 'whole' THEN r.total WHEN 'none' THEN r.credits
                   ELSE g.balances[cardinality(r.amounts)] - r.start END,
       cardinality(r.amounts) - n.declined, n.declined,
       r.kind = 'none', CASE WHEN %(declines)s AND r.kind = 'none' THEN r.amounts END
FROM (SELECT x.*, CASE WHEN x.must_loop OR x.start + x.credits > x.hi THEN 'loop'
                       WHEN x.low IS NULL OR x.start + x.low >= x.lo THEN 'whole'
                       WHEN x.start + x.high < x.lo THEN 'none'
                       ELSE 'loop' END AS kind
      FROM (SELECT y.*, y.held + y.head AS start, greatest(%(floor)s, %(low)s + y.head) AS lo,
                   %(high)s + y.head AS hi
            FROM (SELECT r.*, coalesce(s.value, 0) AS held, {headroom} AS head
                  FROM ({source}) r LEFT JOIN {state} s ON {s_is_r}) y) x
      OFFSET 0) r
LEFT JOIN LATERAL (SELECT f.grants, f.balances, cardinality(array_positions(f.grants, false)) AS declined
                   FROM {s}.guarded_run(r.start, r.lo, r.amounts, r.hi) f WHERE r.kind = 'loop' OFFSET 0) g ON true,
LATERAL (SELECT CASE r.kind WHEN 'whole' THEN 0 WHEN 'none' THEN r.debits ELSE g.declined END AS declined) n
WHERE cardinality(r.amounts) > 0

-- name: decision_decide_runs
-- One row per key: the balance its run started from, with its verdicts only when the loop decided them.
INSERT INTO {s}.decision_runs (topology_id, decision, txid, attempt, key, start, requests, grants, balances,
                               debits_declined)
SELECT %(t)s, %(d)s, %(txid)s, %(attempt)s, jsonb_build_array({keys}), start,
       CASE WHEN grants IS NOT NULL THEN requests END, grants, balances, debits_declined
FROM {decided}

-- name: decision_declined_create
-- This commit's declined requests (decision, request), read by the output append.
CREATE TEMP TABLE IF NOT EXISTS txn_declined (decision text, request text) ON COMMIT DELETE ROWS

-- name: decision_declined
INSERT INTO txn_declined
SELECT %(d)s, u.request FROM {decided} r, unnest(r.requests, r.grants, r.amounts) AS u(request, granted, amount)
WHERE r.declined > 0 AND (NOT u.granted OR (r.debits_declined AND u.amount < 0))

-- name: decision_granted_delta
SELECT {keys}, delta AS value FROM {decided} WHERE granted > 0

-- name: decision_decided_counts
SELECT coalesce(sum(granted), 0), coalesce(sum(declined), 0) FROM {decided}

-- name: decision_other_attempts
SELECT attempt FROM {s}.decision_checks
WHERE topology_id = %(t)s AND decision = %(d)s AND txid = %(txid)s AND attempt IS DISTINCT FROM %(attempt)s

-- name: decision_forget_attempts
DELETE FROM {s}.decision_requests
WHERE topology_id = %(t)s AND decision = %(d)s AND txid = %(txid)s AND attempt = ANY(%(attempts)s)

-- name: decision_output_filter
-- The condition (on staged output event o; parameters txid, attempt) that keeps an event emitted
-- for a request only if this commit decided the request its way.
(o.request IS NULL OR (EXISTS (SELECT 1 FROM {s}.decision_requests r WHERE r.topology_id = {t}
                               AND r.decision = o.decision AND r.request_id = o.request AND r.txid = %(txid)s
                               AND r.attempt = %(attempt)s)
                       AND o.granted = NOT EXISTS (SELECT 1 FROM txn_declined v
                                                   WHERE v.decision = o.decision AND v.request = o.request)))

-- name: decision_forget_topology
DELETE FROM {s}.decision_requests WHERE topology_id = %(t)s;
DELETE FROM {s}.decision_runs WHERE topology_id = %(t)s;
DELETE FROM {s}.decision_checks WHERE topology_id = %(t)s;
DELETE FROM {s}.decision_conflicts WHERE topology_id = %(t)s

-- name: decision_verdicts
SELECT request_id, txid, granted, amount, balance_after, key FROM {s}.verdicts
WHERE topology_id = %(t)s AND decision = %(d)s AND request_id = ANY(%(requests)s)

