-- The provider's schema. ``{s}`` is the schema (quoted); every other name is fixed.
-- Until the first release this is the one schema file: a change edits it (tests/unit/test_schema.py
-- keeps it so). From the first release on it is never edited: each change is the next file
-- (0002_what_it_does.sql), applied in order by store/migrations.py.

-- One row per topology: its declaration (written by the schema's owner only: docs/guides/security.md),
-- its checkpoint (committed txid and offsets), and the mark of a running rebuild. Its row lock
-- serialises the topology's plans and commits.
CREATE TABLE {s}.topologies (
    topology_id       text PRIMARY KEY,
    num               serial UNIQUE,
    spec              jsonb NOT NULL,
    committed_txid    bigint NOT NULL DEFAULT 0,
    committed_offsets jsonb NOT NULL DEFAULT '{{}}',
    last_commit_at    timestamptz,
    lost_records      bigint NOT NULL DEFAULT 0,
    -- while a rebuild recomputes the states as of this txid, commits keep their staged rows (its
    -- journal); only the rebuild with this id may swap its tables in
    rebuild_from_txid bigint,
    rebuild_id        text,
    created_at        timestamptz NOT NULL DEFAULT now(),
    updated_at        timestamptz NOT NULL DEFAULT now(),
    -- What a Kafka topology's committed batches skipped: offsets that held no committed record for a
    -- read_committed reader (aborted transactions' records, transaction markers) -- the offsets a
    -- batch's plan spans less the records its commit read.
    offsets_skipped   bigint NOT NULL DEFAULT 0,
    -- The delta history (store/history.py): a commit keeps its attempt's staged rows (the per-key
    -- deltas it applied) in the state's staging table; the rows of a (txid, attempt) that has a commit
    -- row are the history. It has every txid after history_from_txid; history_base: whether the rows
    -- at history_from_txid are a snapshot of each state as of that txid (0: the empty state).
    history_from_txid bigint NOT NULL DEFAULT 0,
    history_base      boolean NOT NULL DEFAULT true,
    -- The shadow audit's mark (core/verify.py): the last txid of the contiguous run of passing txids
    -- from the first. Never past the committed txid, whoever writes it.
    verified_through  bigint NOT NULL DEFAULT 0,
    CHECK (verified_through BETWEEN 0 AND committed_txid)
);

-- One row per planned transaction (one DAG run): its batch as exact source offsets. A txid that
-- failed for good (Airflow gave up retrying) is marked, so later commits fail fast instead of
-- holding max_active_runs slots (docs/design.md, trap 2); planning or processing it again lifts
-- the mark.
CREATE TABLE {s}.transactions (
    topology_id     text NOT NULL REFERENCES {s}.topologies ON DELETE CASCADE,
    txid            bigint NOT NULL CHECK (txid > 0),
    run_key         text NOT NULL,
    plan_version    integer NOT NULL DEFAULT 1,
    start_offsets   jsonb NOT NULL,
    end_offsets     jsonb NOT NULL,
    batch           jsonb NOT NULL,
    planned_records bigint NOT NULL,
    status          text NOT NULL DEFAULT 'planned' CHECK (status IN ('planned', 'committed')),
    planned_at      timestamptz NOT NULL DEFAULT clock_timestamp(),
    replanned_at    timestamptz,
    replan_reason   text,
    pinned_attempt  integer,
    committed_at    timestamptz,
    failed_at       timestamptz,
    failure         text,
    -- What the first complete attempt of the plan read (how many records, the sum of their
    -- offsets' CRC-32s): a later attempt that read other records cannot complete (transactional).
    read_digest     text,
    -- How often its processing failed as Airflow saw it (a driver killed before it registered
    -- an attempt leaves no attempt row), and the last reason, in one line.
    failed_tries    integer NOT NULL DEFAULT 0,
    last_try_failure text,
    last_try_failed_at timestamptz,
    -- A correction: a transaction that re-processes committed txids under the current code and
    -- commits the difference (corrects names the txids), or replays quarantined records (it names
    -- the records and the txids they came from); null for a batch of new records.
    corrects        jsonb,
    PRIMARY KEY (topology_id, txid),
    UNIQUE (topology_id, run_key)
);
CREATE INDEX ON {s}.transactions (topology_id, status, txid);

-- A committed txid's plan is what the shadow audit recomputes and what a correction re-reads: once
-- committed, what it read (offsets, batch, records, read digest) and what it corrects stay as its
-- commit left them, whoever writes (short of the table's owner turning the trigger off). Else a role
-- that updates plans could point a committed txid at other records -- another txid's, counted twice
-- -- whose recomputation matches what it committed.
CREATE FUNCTION {s}.committed_plan_guard() RETURNS trigger
LANGUAGE plpgsql AS $body$
BEGIN
    IF (NEW.status, NEW.plan_version, NEW.start_offsets, NEW.end_offsets, NEW.batch, NEW.planned_records,
        NEW.read_digest, NEW.corrects) IS DISTINCT FROM (OLD.status, OLD.plan_version, OLD.start_offsets,
        OLD.end_offsets, OLD.batch, OLD.planned_records, OLD.read_digest, OLD.corrects) THEN
        RAISE EXCEPTION 'topology % txid % is committed: its plan, what it read and what it corrects stay as its '
                        'commit left them', OLD.topology_id, OLD.txid
            USING ERRCODE = 'check_violation';
    END IF;
    RETURN NEW;
END
$body$;
CREATE TRIGGER committed_plan_guard BEFORE UPDATE ON {s}.transactions
    FOR EACH ROW WHEN (OLD.status = 'committed') EXECUTE FUNCTION {s}.committed_plan_guard();

CREATE TABLE {s}.attempts (
    topology_id  text NOT NULL,
    txid         bigint NOT NULL,
    attempt      integer NOT NULL CHECK (attempt > 0),
    plan_version integer NOT NULL,
    status       text NOT NULL CHECK (status IN ('running', 'complete', 'failed', 'discarded', 'committed')),
    started_at   timestamptz NOT NULL DEFAULT clock_timestamp(),
    finished_at  timestamptz,
    row_counts   jsonb,
    records_read bigint,
    quarantined  bigint NOT NULL DEFAULT 0,
    worker       text,
    error        text,
    -- What the attempt read: how many records, the sum of the CRC-32s of their offsets.
    read_digest  text,
    -- What produced it: the digests of the Spark application, the provider and the declaration it
    -- ran with, and the Airflow DAG version of its run (provenance.py).
    code         jsonb,
    PRIMARY KEY (topology_id, txid, attempt),
    FOREIGN KEY (topology_id, txid) REFERENCES {s}.transactions ON DELETE CASCADE
);

-- The audit log: one row per committed txid, in order.
CREATE TABLE {s}.commits (
    topology_id       text NOT NULL REFERENCES {s}.topologies ON DELETE CASCADE,
    txid              bigint NOT NULL,
    attempt           integer NOT NULL,
    plan_version      integer NOT NULL,
    run_key           text NOT NULL,
    start_offsets     jsonb NOT NULL,
    end_offsets       jsonb NOT NULL,
    records_read      bigint NOT NULL,
    row_counts        jsonb NOT NULL,
    quarantined       bigint NOT NULL,
    committer         text,
    commit_started_at timestamptz NOT NULL,
    committed_at      timestamptz NOT NULL DEFAULT clock_timestamp(),
    -- The code of its attempt; per state, the rows it applied and a hash of them ("rows:hash", the
    -- same for the same deltas whatever their order) and per output its events'; what it corrects.
    code              jsonb,
    digests           jsonb,
    corrects          jsonb,
    PRIMARY KEY (topology_id, txid)
);

-- Bad records of attempts. A record keeps a prefix of its raw text (QUARANTINE_RECORD_CHARS) and
-- its full length: one poison record of a gigabyte must not travel to the driver or in here whole.
CREATE TABLE {s}.quarantine (
    id            bigserial PRIMARY KEY,
    topology_id   text NOT NULL,
    txid          bigint NOT NULL,
    attempt       integer NOT NULL,
    source_offset text NOT NULL,
    event_id      text,
    reason        text NOT NULL,
    record        text,
    record_length bigint,
    committed     boolean NOT NULL DEFAULT false,
    created_at    timestamptz NOT NULL DEFAULT clock_timestamp(),
    -- Which COPY wrote the row: the attempt's COPY and the Spark partition it streamed ('3:17'),
    -- and the Spark task attempt that ran it (null: the driver, which runs each COPY once). A task
    -- run again after its COPY committed copies its slice again; the commit keeps one writer's
    -- rows per slice. (Two rows of one writer are two records, even with equal text.)
    slice         text,
    writer        bigint,
    -- A record counted by a correction names it (corrected_by): it is counted at most once. A replay
    -- takes its records when it is planned (replayed_by): each is replayed at most once, as it is or
    -- as edited (edited_record); one that fails again is quarantined anew, by the replay.
    corrected_by  bigint,
    replayed_by   bigint,
    edited_record text,
    edited_at     timestamptz
);
CREATE INDEX ON {s}.quarantine (topology_id, txid, attempt);

-- Event logs (sources/eventlog.py): partitions with their next LSN, events with unique ids, and
-- the ids retention removed (dedupe must outlive the events, or a late duplicate delivery would
-- be appended and counted again).
CREATE TABLE {s}.logs (
    log_name   text PRIMARY KEY,
    partitions integer NOT NULL CHECK (partitions > 0),
    created_at timestamptz NOT NULL DEFAULT now()
);
CREATE TABLE {s}.log_partitions (
    log_name          text NOT NULL REFERENCES {s}.logs ON DELETE CASCADE,
    partition         integer NOT NULL,
    next_lsn          bigint NOT NULL DEFAULT 1,
    truncated_through bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (log_name, partition)
);
CREATE TABLE {s}.log_events (
    log_name    text NOT NULL,
    partition   integer NOT NULL,
    lsn         bigint NOT NULL,
    event_id    text NOT NULL,
    payload     text NOT NULL,
    appended_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (log_name, partition, lsn)
);
CREATE UNIQUE INDEX log_events_event_id ON {s}.log_events (log_name, event_id);
CREATE TABLE {s}.log_retired_ids (
    log_name text NOT NULL,
    event_id text NOT NULL,
    PRIMARY KEY (log_name, event_id)
);
-- The roles that may append to a log besides the schema's owner (``airflow-txn grant
-- --producer-role ROLE --log LOG``), through append_events alone.
CREATE TABLE {s}.log_writers (
    log_name  text NOT NULL REFERENCES {s}.logs ON DELETE CASCADE,
    role_name name NOT NULL,
    PRIMARY KEY (log_name, role_name)
);

-- A partition's counters only ever move forward, whoever writes them: a rewound next_lsn would
-- hand out LSNs a reader already passed, a rewound truncation point would resurrect nothing and
-- hide the loss, and truncating past the head would remove events not appended yet. The owner's
-- repair of a counter (airflow-txn repair-log): inside a transaction that set
-- airflow_transactional.repair_log to 'on', the table's owner may move next_lsn back -- never to
-- an LSN the partition holds (nor below what a reader planned: sources/eventlog.py checks).
CREATE FUNCTION {s}.log_partition_guard() RETURNS trigger
LANGUAGE plpgsql AS $body$
BEGIN
    IF NEW.next_lsn < OLD.next_lsn AND coalesce(current_setting('airflow_transactional.repair_log', true), '') = 'on'
            AND pg_has_role(current_user, (SELECT c.relowner FROM pg_catalog.pg_class c WHERE c.oid = TG_RELID),
                            'MEMBER')
            AND NEW.truncated_through = OLD.truncated_through AND NEW.truncated_through < NEW.next_lsn
            AND NOT EXISTS (SELECT 1 FROM {s}.log_events e WHERE e.log_name = NEW.log_name
                            AND e.partition = NEW.partition AND e.lsn >= NEW.next_lsn) THEN
        RETURN NEW;
    END IF;
    IF NEW.next_lsn < OLD.next_lsn OR NEW.truncated_through < OLD.truncated_through
            OR NEW.truncated_through >= NEW.next_lsn THEN
        RAISE EXCEPTION 'log % partition %: next_lsn and truncated_through only move forward, and retention stops '
                        'at the head (next_lsn % -> %, truncated_through % -> %)', OLD.log_name, OLD.partition,
                        OLD.next_lsn, NEW.next_lsn, OLD.truncated_through, NEW.truncated_through
            USING ERRCODE = 'check_violation',
                  HINT = 'a counter set too far by mistake is repaired by the schema''s owner: airflow-txn repair-log LOG';
    END IF;
    RETURN NEW;
END
$body$;
CREATE TRIGGER log_partition_guard BEFORE UPDATE ON {s}.log_partitions
    FOR EACH ROW EXECUTE FUNCTION {s}.log_partition_guard();

-- The one door of producers into a log (sources/eventlog.py): owned by the schema's owner, run
-- with its rights, callable only by the roles granted it. It appends (partition, id, payload)
-- triples in the order given, under each partition's lock in partition order (so LSNs become
-- visible in order, docs/design.md trap 6), drops ids the log holds or held (and repeats within
-- the call), and refuses -- returning them -- ids longer than 512 bytes and ids in the id space
-- of a topology that appends to this log (its events are '<topology>:<origin>'), and payloads
-- over the record limit (limits.MAX_RECORD_BYTES). The partition locks it takes are held until
-- the caller's transaction ends, and a topology's commit appending to the same log waits for
-- them: the caller's transaction is ended once idle for 5 s (a SET LOCAL of
-- idle_in_transaction_session_timeout, undone when that transaction ends), so a producer that
-- appends and forgets to commit holds no commit for longer than that.
CREATE FUNCTION {s}.append_events(log text, partitions integer[], ids text[], payloads text[],
                                  OUT appended bigint, OUT duplicates bigint, OUT refused text[])
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $body$
DECLARE
    known integer;
    reserved text[];
    part integer;
    base bigint;
    handed bigint;
    inserted bigint;
BEGIN
    IF NOT (pg_has_role(session_user, current_user, 'MEMBER') OR EXISTS (
            SELECT 1 FROM {s}.log_writers w WHERE w.log_name = append_events.log
            AND pg_has_role(session_user, w.role_name, 'MEMBER'))) THEN
        RAISE EXCEPTION 'role % may not append to log %', session_user, append_events.log
            USING ERRCODE = 'insufficient_privilege',
                  HINT = 'the schema''s owner grants it: airflow-txn grant --producer-role ROLE --log LOG';
    END IF;
    PERFORM pg_catalog.set_config('idle_in_transaction_session_timeout', '5s', true);
    SELECT l.partitions INTO known FROM {s}.logs l WHERE l.log_name = append_events.log;
    IF known IS NULL THEN
        RAISE EXCEPTION 'log % does not exist', append_events.log USING ERRCODE = 'undefined_object';
    END IF;
    IF cardinality(ids) IS DISTINCT FROM cardinality(partitions)
            OR cardinality(ids) IS DISTINCT FROM cardinality(payloads) THEN
        RAISE EXCEPTION 'append_events takes as many partitions, ids and payloads' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF EXISTS (SELECT 1 FROM unnest(partitions) p WHERE p IS NULL OR p < 0 OR p >= known)
            OR EXISTS (SELECT 1 FROM unnest(ids, payloads) AS r(id, payload) WHERE r.id IS NULL OR r.payload IS NULL) THEN
        RAISE EXCEPTION 'log % has partitions 0..%, and every event an id and a payload', append_events.log, known - 1
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    SELECT coalesce(array_agg(t.topology_id || ':'), '{{}}') INTO reserved FROM {s}.topologies t
    WHERE EXISTS (SELECT 1 FROM jsonb_array_elements(coalesce(t.spec->'outputs', '[]')) o
                  WHERE o->>'log' = append_events.log);
    refused := ARRAY(SELECT r.id FROM unnest(ids, payloads) AS r(id, payload)
                     WHERE octet_length(r.id) > 512 OR octet_length(r.payload) > 1048576
                     OR EXISTS (SELECT 1 FROM unnest(reserved) p WHERE starts_with(r.id, p)));
    appended := 0;
    FOR part IN SELECT DISTINCT p FROM unnest(partitions) p ORDER BY p LOOP
        SELECT lp.next_lsn INTO base FROM {s}.log_partitions lp
        WHERE lp.log_name = append_events.log AND lp.partition = part FOR UPDATE;
        -- OFFSET 0 keeps each NOT EXISTS one index probe per event (a join, on a log grown since its statistics, nests a scan of the log under each event).
        WITH given AS (SELECT r.p, r.id, r.payload, r.ord FROM unnest(partitions, ids, payloads) WITH ORDINALITY
                       AS r(p, id, payload, ord) WHERE NOT r.id = ANY(refused)),
        first AS (SELECT DISTINCT ON (g.id) g.* FROM given g ORDER BY g.id, g.ord),
        fresh AS (SELECT f.* FROM first f WHERE f.p = part
                  AND NOT EXISTS (SELECT 1 FROM {s}.log_events k WHERE k.log_name = append_events.log
                                  AND k.event_id = f.id OFFSET 0)
                  AND NOT EXISTS (SELECT 1 FROM {s}.log_retired_ids k WHERE k.log_name = append_events.log
                                  AND k.event_id = f.id OFFSET 0)),
        numbered AS (SELECT base + row_number() OVER (ORDER BY f.ord) - 1 AS lsn, f.id, f.payload FROM fresh f),
        ins AS (INSERT INTO {s}.log_events (log_name, partition, lsn, event_id, payload)
                SELECT append_events.log, part, n.lsn, n.id, n.payload FROM numbered n
                ON CONFLICT (log_name, event_id) DO NOTHING RETURNING 1)
        SELECT (SELECT count(*) FROM numbered), (SELECT count(*) FROM ins) INTO handed, inserted;
        -- a concurrent append of the same id to another partition can still win the unique
        -- index: its LSN stays a harmless gap; the counter moves past every LSN handed out
        UPDATE {s}.log_partitions lp SET next_lsn = base + handed
        WHERE lp.log_name = append_events.log AND lp.partition = part;
        appended := appended + inserted;
    END LOOP;
    duplicates := cardinality(ids) - cardinality(refused) - appended;
END
$body$;
REVOKE ALL ON FUNCTION {s}.append_events(text, integer[], text[], text[]) FROM PUBLIC;

-- The commit's door into a log (store/outputs.py): the run-time role appends a txid's output
-- events through it and needs neither UPDATE on log_partitions nor INSERT on log_events -- with
-- them it could set a partition's counter to the largest bigint (every later append failing,
-- and the forward-only guard refusing any rewind) or write any event into any log. Under the
-- partition's lock, it leaves out ids the log holds or held, numbers the rest from the next LSN
-- in the order given, and advances the counter past them; an id held with another payload is
-- reported (clash), not appended. first_lsn is null when the log has no such partition.
CREATE FUNCTION {s}.append_outputs(log text, part integer, ids text[], payloads text[],
                                   OUT first_lsn bigint, OUT handed_out bigint, OUT inserted bigint,
                                   OUT clash text)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $body$
BEGIN
    SELECT lp.next_lsn INTO first_lsn FROM {s}.log_partitions lp
    WHERE lp.log_name = append_outputs.log AND lp.partition = part FOR UPDATE;
    IF first_lsn IS NULL THEN
        RETURN;
    END IF;
    IF cardinality(ids) IS DISTINCT FROM cardinality(payloads)
            OR EXISTS (SELECT 1 FROM unnest(ids, payloads) AS r(id, payload) WHERE r.id IS NULL OR r.payload IS NULL) THEN
        RAISE EXCEPTION 'append_outputs takes as many ids as payloads, none null' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    -- OFFSET 0 keeps each probe one index lookup per event (see append_events).
    WITH given AS (
        SELECT r.id, r.payload, r.ord,
               (SELECT k.payload FROM {s}.log_events k WHERE k.log_name = append_outputs.log AND k.event_id = r.id
                OFFSET 0) AS held,
               EXISTS (SELECT 1 FROM {s}.log_retired_ids k WHERE k.log_name = append_outputs.log
                       AND k.event_id = r.id OFFSET 0) AS retired
        FROM unnest(ids, payloads) WITH ORDINALITY AS r(id, payload, ord)),
    numbered AS (SELECT first_lsn + row_number() OVER (ORDER BY g.ord) - 1 AS lsn, g.id, g.payload
                 FROM given g WHERE g.held IS NULL AND NOT g.retired),
    ins AS (INSERT INTO {s}.log_events (log_name, partition, lsn, event_id, payload)
            SELECT append_outputs.log, part, n.lsn, n.id, n.payload FROM numbered n
            ON CONFLICT (log_name, event_id) DO NOTHING RETURNING 1)
    SELECT (SELECT count(*) FROM numbered), (SELECT count(*) FROM ins),
           (SELECT g.id FROM given g WHERE g.held <> g.payload ORDER BY g.id LIMIT 1)
    INTO handed_out, inserted, clash;
    IF clash IS NULL AND handed_out > 0 THEN
        UPDATE {s}.log_partitions lp SET next_lsn = first_lsn + handed_out
        WHERE lp.log_name = append_outputs.log AND lp.partition = part;
    END IF;
END
$body$;
REVOKE ALL ON FUNCTION {s}.append_outputs(text, integer, text[], text[]) FROM PUBLIC;

-- Landing files (sources/landing.py), known by content: a file replaced under the same name is
-- a new version (a new seq), and a planned file whose content changed is unavailable.
CREATE TABLE {s}.landing_files (
    topology_id   text NOT NULL REFERENCES {s}.topologies ON DELETE CASCADE,
    seq           bigint NOT NULL,
    path          text NOT NULL,
    size          bigint NOT NULL,
    mtime         double precision NOT NULL,
    mtime_ns      bigint,
    inode         bigint,
    sha256        text,
    registered_at timestamptz NOT NULL DEFAULT now(),
    -- Whether every line is within the record limit and escapes no surrogate: Spark's JSON reader may
    -- read the file as it is (null: not looked at, read as text and judged line by line).
    plain         boolean,
    -- On object storage and HDFS (sources/objectlanding.py) a file is known by the version its store
    -- gives it -- an S3 object's version id or ETag, an HDFS file's file id -- besides its size and
    -- modification time (null for a file on a local disk, known by its inode and SHA-256).
    version       text,
    PRIMARY KEY (topology_id, seq)
);
CREATE INDEX ON {s}.landing_files (topology_id, path, seq);
-- The greatest name registered in byte order (an S3 listing's and an HDFS directory's order), where
-- an incremental listing starts: found at the end of this index, whatever the number of files.
CREATE INDEX ON {s}.landing_files (topology_id, path COLLATE "C");

-- Decisions in commit order (store/decisions.py). COLLATE "C" and few indexes: a completion
-- writes a row per request, and each extra index or foreign-key check costs every request
-- (reset deletes the rows itself).
-- The requests an attempt will decide, recorded when it completes: not decided by a txid
-- committed then, in the order of their key's run (``prefix``: the run's sum up to the request,
-- all granted; ``cprefix``: the credits up to it).
CREATE TABLE {s}.decision_requests (
    topology_id text COLLATE "C" NOT NULL,
    decision    text COLLATE "C" NOT NULL,
    request_id  text COLLATE "C" NOT NULL,
    txid        bigint NOT NULL,
    attempt     integer NOT NULL,
    seq         bigint,
    key         jsonb NOT NULL,
    amount      numeric NOT NULL,
    prefix      numeric NOT NULL,
    cprefix     numeric,
    PRIMARY KEY (topology_id, decision, request_id, txid, attempt)
);
-- Requests are probed by id; a block-range index finds a txid's rows (recorded in txid order
-- mostly) and is never a candidate for those probes, whatever the statistics say.
CREATE INDEX decision_requests_by_txid ON {s}.decision_requests USING brin (txid) WITH (pages_per_range = 16);
-- Per attempt: the txid committed when its requests were recorded, and how many it staged (the
-- commit verifies the count).
CREATE TABLE {s}.decision_checks (
    topology_id     text COLLATE "C" NOT NULL,
    decision        text COLLATE "C" NOT NULL,
    txid            bigint NOT NULL,
    attempt         integer NOT NULL,
    checked_through bigint NOT NULL,
    staged          bigint NOT NULL,
    PRIMARY KEY (topology_id, decision, txid, attempt)
);
-- Per committed txid and key: the balance its run started from; ``requests``, ``grants`` and
-- ``balances`` only for a run decided request by request (NULL: all granted); a run whose every
-- debit was declined keeps no arrays (``debits_declined``).
CREATE TABLE {s}.decision_runs (
    topology_id     text COLLATE "C" NOT NULL,
    decision        text COLLATE "C" NOT NULL,
    txid            bigint NOT NULL,
    attempt         integer NOT NULL,
    key             jsonb NOT NULL,
    start           numeric NOT NULL,
    requests        text[],
    grants          boolean[],
    balances        numeric[],
    debits_declined boolean
);
CREATE INDEX decision_runs_by_txid ON {s}.decision_runs USING brin (txid) WITH (pages_per_range = 16);
-- Requests an attempt shares with another uncommitted txid, found when attempts complete; the
-- commit keeps one when no txid committed before decided it, else leaves it out.
CREATE TABLE {s}.decision_conflicts (
    topology_id text COLLATE "C" NOT NULL,
    decision    text COLLATE "C" NOT NULL,
    request_id  text COLLATE "C" NOT NULL,
    txid        bigint NOT NULL,
    attempt     integer NOT NULL,
    seq         bigint,
    key         jsonb NOT NULL,
    amount      numeric NOT NULL,
    PRIMARY KEY (topology_id, decision, request_id, txid, attempt)
);
-- Every request's verdict and the balance after it: a requester's status.
CREATE VIEW {s}.verdicts AS
SELECT r.topology_id, r.decision, r.request_id, r.txid, r.seq, r.key, r.amount,
       CASE WHEN u.debits_declined THEN r.amount >= 0
            ELSE coalesce(u.grants[array_position(u.requests, r.request_id::text)], true) END AS granted,
       CASE WHEN u.debits_declined THEN u.start + coalesce(r.cprefix, 0)
            ELSE coalesce(u.balances[array_position(u.requests, r.request_id::text)], u.start + r.prefix)
       END AS balance_after
FROM {s}.decision_requests r
JOIN {s}.decision_runs u ON u.txid = r.txid AND u.topology_id = r.topology_id AND u.decision = r.decision
 AND u.attempt = r.attempt AND u.key = r.key;

-- One key's requests in order: a debit is granted when the balance stays at or above the floor,
-- a credit when it stays at or below the ceiling (what the state's type holds); a declined one
-- leaves the balance as it was. The balance after each request.
CREATE FUNCTION {s}.guarded_run(start numeric, floor numeric, amounts numeric[], ceiling numeric,
                                OUT grants boolean[], OUT balances numeric[])
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $body$
DECLARE
    balance numeric := start;
    amount numeric;
BEGIN
    grants := ARRAY[]::boolean[];
    balances := ARRAY[]::numeric[];
    FOREACH amount IN ARRAY amounts LOOP
        IF (amount >= 0 AND balance + amount <= ceiling) OR (amount < 0 AND balance + amount >= floor) THEN
            balance := balance + amount;
            grants := grants || true;
        ELSE
            grants := grants || false;
        END IF;
        balances := balances || balance;
    END LOOP;
END
$body$;

-- Where each commit appended its output events: per (txid, output, partition) the range of LSNs,
-- which only that commit wrote (it held the partition's lock), so a publisher reads exactly a
-- txid's events.
CREATE TABLE {s}.output_ranges (
    topology_id text NOT NULL REFERENCES {s}.topologies ON DELETE CASCADE,
    txid        bigint NOT NULL,
    output      text NOT NULL,
    log_name    text NOT NULL,
    partition   integer NOT NULL,
    first_lsn   bigint NOT NULL,
    last_lsn    bigint NOT NULL,
    PRIMARY KEY (topology_id, txid, output, partition)
);

-- How far each output published to Kafka is: the last txid published, and the topic's end offsets
-- after it -- where a publisher that restarts looks for a later txid it published before it could
-- record it here.
CREATE TABLE {s}.publications (
    topology_id    text NOT NULL REFERENCES {s}.topologies ON DELETE CASCADE,
    output         text NOT NULL,
    topic          text NOT NULL,
    published_txid bigint NOT NULL DEFAULT 0,
    topic_offsets  jsonb NOT NULL DEFAULT '{{}}',
    published_at   timestamptz,
    PRIMARY KEY (topology_id, output)
);

-- Turns: one row per thing whose runs take turns -- an output's publisher, a decision's
-- completions, a rebuild's liveness. Holding the row's lock is holding the turn. An advisory lock
-- served before; but any role may take any advisory lock, and their keys followed from public
-- names: a producer held one and stalled a topology's decisions and publishing. Only the roles
-- granted UPDATE here (the owner, the run-time role) can lock these rows.
CREATE TABLE {s}.turns (
    name text PRIMARY KEY
);

-- When a landing directory listed incrementally (only the names after the last one registered) last
-- listed all of its files: a full listing now and then finds names that sorted earlier and overwrites.
CREATE TABLE {s}.landing_listings (
    topology_id text PRIMARY KEY REFERENCES {s}.topologies ON DELETE CASCADE,
    full_at     timestamptz NOT NULL
);

-- Compensating events (core/corrections.py): a correction of a topology with output logs appends,
-- for each event its txids appended that the fixed code no longer emits as it was, a retraction
-- ('<origin>~retracted@<txid>', the retracted event's payload, in its partition), and for each
-- event the fixed code emits anew or otherwise, a new version ('<origin>~v<txid>' when the origin's
-- id is taken, else the origin's own id). Each is recorded here in the same transaction as its
-- append: a reader of the log (sources/pglog.py) knows a retraction by this row and applies it
-- negated; origin is the log's id of the event it retracts or versions.
CREATE TABLE {s}.log_versions (
    log_name    text NOT NULL,
    event_id    text NOT NULL,
    origin      text NOT NULL,
    retraction  boolean NOT NULL,
    topology_id text NOT NULL,
    txid        bigint NOT NULL,
    PRIMARY KEY (log_name, event_id)
);
CREATE INDEX ON {s}.log_versions (log_name, origin);

-- The last preview of a correction of each range (core/corrections.py preview: the topology's job
-- re-processed txids first..last under the code deployed then, committing nothing): what the
-- Transactions view's correction page shows beside what the range applied.
CREATE TABLE {s}.correction_previews (
    topology_id  text NOT NULL REFERENCES {s}.topologies ON DELETE CASCADE,
    first_txid   bigint NOT NULL,
    last_txid    bigint NOT NULL,
    result       jsonb NOT NULL,
    previewed_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (topology_id, first_txid, last_txid)
);

-- A replay takes a quarantined record that retracts an upstream event back, negated: found by the
-- record's event id.
CREATE INDEX ON {s}.log_versions (event_id);

-- Where a publisher put a correction's retractions in its Kafka topic (core/publish.py), recorded
-- with the txid's publication: a topology of this store reading that topic takes each back,
-- negated, as a reader of the log does (sources/kafka.py), where a reader that does not know it
-- quarantines the record by its header. The cluster and topic ids are those a reader's batch
-- names: a topic of the same name on another cluster, or recreated, is not this one.
CREATE TABLE {s}.published_retractions (
    cluster_id   text NOT NULL,
    topic_id     text NOT NULL,
    partition    integer NOT NULL,
    kafka_offset bigint NOT NULL,
    topic        text NOT NULL,
    origin       text NOT NULL,
    topology_id  text NOT NULL,
    txid         bigint NOT NULL,
    PRIMARY KEY (cluster_id, topic_id, partition, kafka_offset)
);

-- The shadow audit (core/verify.py, docs/guides/verification.md): what checking each committed txid
-- found -- verified (recomputed from its source by the same code: the same deltas), failed (other
-- deltas, or a state that no longer adds up to its history: the detail names the states and keys),
-- unverifiable (its input gone before it was checked, or committed under code no longer deployed:
-- the detail says which), superseded (committed under other code, its range corrected since: it
-- passes once that correction is verified) or skipped (not sampled). A committed txid without a row
-- is pending.
CREATE TABLE {s}.verifications (
    topology_id text NOT NULL,
    txid        bigint NOT NULL,
    status      text NOT NULL CHECK (status IN ('verified', 'failed', 'unverifiable', 'superseded', 'skipped')),
    detail      jsonb NOT NULL DEFAULT jsonb_build_object(),
    checked_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (topology_id, txid),
    FOREIGN KEY (topology_id, txid) REFERENCES {s}.commits ON DELETE CASCADE
);
