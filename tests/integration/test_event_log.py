"""The Postgres event log: idempotent appends, retries across a server restart, and planning
that never skips an event which becomes visible late (docs/design.md, trap 6)."""

from __future__ import annotations

import json
import multiprocessing as mp
import subprocess
import sys
import threading
import time

import pytest

from airflow_transactional.coordinator import Coordinator
from airflow_transactional.exceptions import ConfigError
from airflow_transactional.processing import process_batch
from airflow_transactional.sources import EventLog, PostgresLogSource
from airflow_transactional.spec import StateSpec, TopologySpec
from dev import faults
from dev.embedded import EmbeddedPostgres
from tests.helpers import click, counting_topology, make_log, query, run_one

pytestmark = pytest.mark.integration


def test_duplicate_deliveries_are_stored_once(dsn: str) -> None:
    log = make_log(dsn)
    first = log.append([click(i) for i in range(10)])
    again = log.append([click(i) for i in range(5, 15)] + [click(20), click(20)])
    assert (first.appended, first.duplicates) == (10, 0)
    assert (again.appended, again.duplicates) == (6, 6)
    assert query(dsn, "SELECT count(*), count(DISTINCT event_id) FROM airflow_txn.log_events") == [(16, 16)]


def test_lsns_are_dense_per_partition(dsn: str) -> None:
    log = make_log(dsn, partitions=2)
    log.append([click(i) for i in range(50)])
    log.append([click(i) for i in range(40, 90)])
    for p in (0, 1):
        lsns = [r[0] for r in query(dsn, "SELECT lsn FROM airflow_txn.log_events WHERE partition = %s "
                                         "ORDER BY lsn", (p,))]
        assert lsns == list(range(1, len(lsns) + 1))


def test_the_duplicate_check_probes_the_index_per_appended_row_whatever_the_statistics(
        pg: EmbeddedPostgres, dsn: str) -> None:
    """Regression (found by bench.perf): with the log grown since its last ANALYZE, the planner
    nested a scan of the whole append under every event of the log -- minutes for 40k events.
    The check in the log's door (append_events) must stay one index probe per appended row: its
    plans, as auto_explain reports them from inside the function."""
    from psycopg2 import connect
    from psycopg2.extensions import parse_dsn

    log = make_log(dsn, partitions=2)
    query(dsn, "ANALYZE airflow_txn.log_events")  # statistics of an empty log ...
    log.append([click(i) for i in range(3000)])  # ... that is no longer empty
    conn = connect(pg.admin_dsn(parse_dsn(dsn)["dbname"]))  # LOAD needs the superuser
    try:
        with conn, conn.cursor() as cur:
            for setting in ("LOAD 'auto_explain'", "SET auto_explain.log_min_duration = 0",
                            "SET auto_explain.log_nested_statements = on", "SET auto_explain.log_level = notice"):
                cur.execute(setting)
            events = [click(i) for i in range(2000, 4000)]
            cur.execute("SELECT appended FROM airflow_txn.append_events('clicks', %s::integer[], %s::text[], "
                        "%s::text[])", ([i % 2 for i in range(2000)], [e for e, _ in events], [p for _, p in events]))
            assert cur.fetchone() == (1000,)
        plans = [n for n in conn.notices if "INSERT INTO \"airflow_txn\".log_events" in n]
        assert len(plans) == 2, conn.notices  # one per partition
        for plan in plans:
            assert plan.count("SubPlan") >= 2 and "Index Only Scan using log_events_event_id" in plan, plan
            assert "Seq Scan on log_events" not in plan and "Join" not in plan, plan
    finally:
        conn.close()


@pytest.mark.parametrize("point", ["append.before_commit", "append.after_commit"])
def test_an_append_whose_connection_drops_is_retried_exactly_once(dsn: str, point: str) -> None:
    log = make_log(dsn)
    events = [click(i) for i in range(25)]
    if point == "append.before_commit":
        with faults.inject(point, "terminate@1"):
            res = log.append(events)
        assert res.retries == 1 and res.appended == 25
    else:
        # The commit succeeded but the producer never heard back: it sends the batch again.
        with faults.inject(point, "raise@1"), pytest.raises(faults.InjectedFault):
            log.append(events)
        res = log.append(events)
        assert (res.appended, res.duplicates) == (0, 25)
    assert query(dsn, "SELECT count(*), count(DISTINCT event_id) FROM airflow_txn.log_events") == [(25, 25)]


def test_appends_survive_a_postgres_restart(pg: EmbeddedPostgres, dsn: str) -> None:
    log = make_log(dsn)
    ids: list[str] = []
    errors: list[BaseException] = []

    def produce() -> None:
        p = EventLog(dsn, "clicks", retry_for=60)
        try:
            for n in range(60):
                batch = [click(n * 10 + i) for i in range(10)]
                p.append(batch)
                ids.extend(e for e, _ in batch)
                time.sleep(0.01)
        except BaseException as exc:
            errors.append(exc)
        finally:
            p.close()

    t = threading.Thread(target=produce)
    t.start()
    time.sleep(0.2)
    pg.restart(mode="fast")
    t.join(120)
    assert not errors and len(ids) == 600
    assert query(dsn, "SELECT count(*), count(DISTINCT event_id) FROM airflow_txn.log_events") == [(600, 600)]
    log.close()


def test_a_plan_never_skips_an_append_still_in_progress(dsn: str, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A producer holds its append open; a plan made meanwhile must not move past its events."""
    log = make_log(dsn, partitions=1)
    coord = Coordinator(dsn)
    coord.register(counting_topology(max_batch_size=1000))
    log.append([click(i) for i in range(5)], partition=0)
    gate = tmp_path / "release"
    slow = subprocess.Popen(
        [sys.executable, "-c",
         "import json,sys; from airflow_transactional.sources import EventLog;"
         f"EventLog({dsn!r}, 'clicks').append([('slow-%d' % i, json.dumps({{'user': 's', 'amount': 1}})) "
         "for i in range(3)], partition=0)"],
        env=faults.child_env(faults=f"append.before_commit=waitfor:{gate}"))
    _until(lambda: gate.with_name("release.waiting").exists() or slow.poll() is not None)
    assert slow.poll() is None, "the slow append ended before it held partition 0"
    fast = threading.Thread(target=lambda: EventLog(dsn, "clicks").append([click(100)], partition=0))
    fast.start()  # waits behind the slow one: its LSN comes after, and becomes visible after
    _until(lambda: query(dsn, "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'")[0][0] > 0)
    t1 = coord.plan("clicks", "r1")
    assert t1.end_offsets == {"0": 5}  # only what is final: not past the in-progress append
    gate.touch()
    assert slow.wait(30) == 0
    fast.join(30)
    t2 = coord.plan("clicks", "r2")
    assert t2.start_offsets == {"0": 5} and t2.end_offsets == {"0": 9}
    for t in (t1, t2):
        process_batch(coord, "clicks", t.txid, lambda r: [("clicks_count", (r["user"],), 1),
                                                          ("clicks_amount", (r["user"],), r["amount"])])
        coord.commit("clicks", t.txid)
    assert sum(v for (v,) in query(dsn, "SELECT value FROM clicks_count")) == 9
    coord.close()


def _until(ready, timeout: float = 60) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not ready():
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(0.05)


def _producer(dsn: str, worker: int, n_batches: int, queue: mp.Queue) -> None:  # type: ignore[type-arg]
    log = EventLog(dsn, "clicks")
    sent = []
    for b in range(n_batches):
        batch = [(f"w{worker}-{b}-{i}", json.dumps({"user": f"w{worker}", "amount": 1})) for i in range(25)]
        log.append(batch)
        sent.extend(e for e, _ in batch)
    log.close()
    queue.put(sent)


def test_eight_producers_while_planning_every_event_in_exactly_one_committed_batch(dsn: str) -> None:
    log = make_log(dsn, partitions=4)
    coord = Coordinator(dsn)
    coord.register(TopologySpec("clicks", PostgresLogSource("clicks"),
                                [StateSpec("per_worker", {"user_id": "text"}, combiner="count")],
                                max_batch_size=120, max_in_flight=4))

    def fn(r):  # type: ignore[no-untyped-def]
        return [("per_worker", (r["user"],), 1)]

    ctx = mp.get_context("spawn")
    queue: mp.Queue = ctx.Queue()  # type: ignore[type-arg]
    procs = [ctx.Process(target=_producer, args=(dsn, w, 20, queue)) for w in range(8)]
    for p in procs:
        p.start()
    run = 0
    while any(p.is_alive() for p in procs) or coord.status("clicks").lag:
        run += 1
        run_one(coord, "clicks", f"r{run}", fn)
    sent = [e for _ in procs for e in queue.get(timeout=60)]
    for p in procs:
        p.join(30)
    assert len(sent) == 8 * 20 * 25
    assert run > 3  # plans really interleaved with the producers
    # Each event's LSN falls in exactly one committed batch's range.
    covered = query(dsn, """
        SELECT e.event_id, count(*) FROM airflow_txn.log_events e
        JOIN airflow_txn.commits c ON c.topology_id = 'clicks'
         AND e.lsn >  (c.start_offsets ->> e.partition::text)::bigint
         AND e.lsn <= (c.end_offsets   ->> e.partition::text)::bigint
        GROUP BY e.event_id""")
    assert sorted(e for e, _ in covered) == sorted(sent)
    assert {n for _, n in covered} == {1}
    counts = dict(query(dsn, "SELECT user_id, value FROM per_worker"))
    assert counts == {f"w{w}": 500 for w in range(8)}
    coord.close()
    log.close()


def test_a_duplicate_arriving_after_retention_is_still_dropped(dsn: str) -> None:
    log = make_log(dsn, partitions=1)
    log.append([click(i) for i in range(5)])
    assert log.truncate(0, 5) == 5
    again = log.append([click(2), click(9)])
    assert (again.appended, again.duplicates) == (1, 1)


def test_retention_never_passes_the_head_nor_what_readers_committed(coordinator: Coordinator, dsn: str) -> None:
    log = make_log(dsn, partitions=1)
    log.append([click(i) for i in range(3)])
    with pytest.raises(ConfigError, match="holds LSNs up to 3"):
        log.truncate(0, 10**6)
    spec = counting_topology(max_batch_size=2)
    coordinator.register(spec)
    run_one(coordinator, "clicks", "r1")  # commits LSN 1..2
    with pytest.raises(ConfigError, match=r"topology .clicks. has committed only through LSN 2.*force=True"):
        log.truncate(0, 3)
    assert log.truncate(0, 2) == 2
    assert coordinator.status("clicks").lag == 1
    assert log.truncate(0, 3, force=True) == 1  # explicit: the reader loses LSN 3
    with pytest.raises(ConfigError, match="non-negative integer"):
        log.truncate(0, -1)


def test_a_record_postgres_cannot_store_is_refused_alone(dsn: str) -> None:
    log = make_log(dsn, partitions=1)
    long_id = "x" * 10_000
    res = log.append([("a", "{}"), ("b", "nul\x00byte"), ("c", "{}"), ("d\x00", "{}"), (long_id, "{}"), ("e", "{}")])
    assert (res.appended, res.duplicates) == (3, 0)
    assert [r[0] for r in res.rejected] == ["b", "d\x00", long_id]
    assert "NUL" in res.rejected[0][1] and "NUL" in res.rejected[1][1]
    assert "10,000 bytes long, more than the 512 allowed" in res.rejected[2][1]
    assert [e for (e,) in query(dsn, "SELECT event_id FROM airflow_txn.log_events ORDER BY lsn")] == ["a", "c", "e"]


def test_an_append_the_server_refuses_fails_at_once_not_after_a_minute_of_retries(dsn: str) -> None:
    """Regression: ProgramLimitExceeded (an OperationalError) was retried for 60 s as a lost connection.
    A 3 kB payload is fine; the statement is made to fail the way a too-big index entry does."""
    import psycopg2

    from airflow_transactional.store.connection import lost_connection

    log = make_log(dsn, partitions=1)
    log.retry_for = 30.0
    query(dsn, "CREATE FUNCTION limit_hit() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
               "RAISE EXCEPTION 'index row too big' USING ERRCODE = 'program_limit_exceeded'; END $$")
    query(dsn, "CREATE TRIGGER limit_hit BEFORE INSERT ON airflow_txn.log_events FOR EACH ROW "
               "EXECUTE FUNCTION limit_hit()")
    started = time.monotonic()
    with pytest.raises(psycopg2.errors.ProgramLimitExceeded) as err:
        log.append([("a", "{}")])
    assert time.monotonic() - started < 5
    assert not lost_connection(err.value)
    assert lost_connection(psycopg2.OperationalError("server closed the connection unexpectedly"))
    assert lost_connection(psycopg2.InterfaceError("connection already closed"))


@pytest.mark.parametrize("events, match", [
    ([("a", None)], "payload must be a str"),
    ([("a", {"url": 1})], "payload must be a str"),
    ([(None, "{}")], "event id must be a non-empty string"),
    ([("a",)], "give \\(event_id, payload\\) pairs"),
    ("abc", "iterable of \\(event_id, payload\\) pairs"),
])
def test_a_malformed_append_is_refused_whole_with_the_fix(dsn: str, events: object, match: str) -> None:
    log = make_log(dsn, partitions=1)
    with pytest.raises(ConfigError, match=match):
        log.append(events)  # type: ignore[arg-type]
    assert query(dsn, "SELECT count(*) FROM airflow_txn.log_events") == [(0,)]


def test_an_event_log_on_a_malformed_dsn_says_so_without_the_password() -> None:
    with pytest.raises(ConfigError) as err:
        EventLog("postgresql://u:s3cr%zzet@127.0.0.1/db", "x").create(1)
    assert "s3cr" not in str(err.value) and "percent-encode" in str(err.value)


@pytest.mark.parametrize("password", ["sec@ret-tail", "a@b@longer-tail", "x@yz"])
def test_an_unencoded_at_sign_in_a_uri_password_leaks_no_piece_of_it(password: str) -> None:
    """Regression: libpq took what follows the password's '@' for the host, and its "could not
    translate host name" error showed the password's tail."""
    import psycopg2

    from airflow_transactional.connections import redact
    from airflow_transactional.store.connection import connect

    uri = f"postgresql://u:{password}@127.0.0.1:1/db"
    with pytest.raises(psycopg2.OperationalError) as err:
        connect(uri, connect_timeout=2)
    for piece in [password, *password.split("@")[1:]]:
        assert piece not in str(err.value), str(err.value)
    assert password.split("@")[-1] not in redact(f"see {uri} here")
