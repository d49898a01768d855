"""The chaos harness's own plumbing, on fakes: what it must survive to be trusted as an oracle.

Each test here pins a gap a soak found (or could have found) in the harness itself; the real
harness runs in ``python -m bench.chaos`` (docs/chaos.md) and, without faults, in
``tests/e2e/test_payments_dags.py``.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from bench.chaos import LEDGER, Chaos, ChaosConfig, Ledger
from dev.localstack import COMPONENTS, AirflowStackError

pytestmark = pytest.mark.unit


class FakeProc:
    def __init__(self) -> None:
        self.returncode: int | None = None

    def poll(self) -> int | None:
        return self.returncode


class FakeStack:
    """Just what Chaos touches of a LocalStack: components, Postgres, a REST client."""

    def __init__(self, base: Path, client: Any) -> None:
        self.base_dir = base
        self.extra_env = {"AIRFLOW_TXN_FAULTS_FILE": str(base / "faults.txt")}
        self.procs: dict[str, FakeProc] = {name: FakeProc() for name in COMPONENTS}
        self.components = COMPONENTS
        self.pg = SimpleNamespace(is_running=lambda: True)
        self.started: list[str] = []
        self._client = client

    def client(self) -> Any:
        return self._client

    def start_component(self, name: str) -> None:
        self.started.append(name)
        self.procs[name] = FakeProc()


def chaos(tmp_path: Path, client: Any = None) -> tuple[Chaos, FakeStack]:
    stack = FakeStack(tmp_path, client)
    return Chaos(stack, ChaosConfig(seed=5)), stack  # type: ignore[arg-type]


def test_a_rest_call_waiting_for_a_dead_api_server_gets_it_restarted(tmp_path: Path) -> None:
    # Found by a soak: the supervisor ran in the driver thread, between REST calls -- so a call
    # waiting out a dead api-server never got it restarted, and the driver gave up after 180 s.
    def runs(dag_id: str) -> list[dict[str, str]]:
        if stack.procs["api-server"].poll() is not None:
            raise ConnectionRefusedError(111, "Connection refused")
        return [{"dag_run_id": "r1", "state": "running"}]

    c, stack = chaos(tmp_path, SimpleNamespace(runs=runs))
    stack.procs["api-server"].returncode = -9  # SIGKILLed, nobody restarted it yet
    supervisor = threading.Thread(target=c.supervisor.loop, daemon=True)
    supervisor.start()
    got: list[dict[str, str]] = []
    caller = threading.Thread(target=lambda: got.append(c.states()), daemon=True)
    caller.start()
    caller.join(30)
    c.supervisor.finished.set()
    supervisor.join(10)
    assert got == [{("chaos_words", "r1"): "running"}]
    assert stack.started == ["api-server"] and c.report.component_restarts == 1


def test_a_trigger_whose_answer_was_lost_is_recorded_once(tmp_path: Path) -> None:
    # The api-server created the run, then died before answering: the retried POST gets a 409.
    created: dict[str, dict[str, str]] = {}
    calls = []

    def trigger(dag_id: str, logical_date: str, run_id: str) -> dict[str, str]:
        calls.append(run_id)
        if run_id in created:
            raise AirflowStackError(f"POST /api/v2/dags/{dag_id}/dagRuns -> 409: already exists")
        created[run_id] = {"dag_run_id": run_id}
        raise ConnectionResetError(104, "Connection reset by peer")

    def run(dag_id: str, run_id: str) -> dict[str, str]:
        return created[run_id]

    c, _ = chaos(tmp_path, SimpleNamespace(trigger=trigger, run=run))
    c.trigger()
    assert c.runs == ["chaos-5-0000"] and calls == ["chaos-5-0000", "chaos-5-0000"]


def test_a_409_for_a_run_that_does_not_exist_is_an_error(tmp_path: Path) -> None:
    def trigger(dag_id: str, logical_date: str, run_id: str) -> dict[str, str]:
        raise AirflowStackError("POST /api/v2/dags/d/dagRuns -> 409: logical date taken")

    def run(dag_id: str, run_id: str) -> dict[str, str]:
        raise AirflowStackError(f"GET /api/v2/dags/d/dagRuns/{run_id} -> 404: not found")

    c, _ = chaos(tmp_path, SimpleNamespace(trigger=trigger, run=run))
    with pytest.raises(AirflowStackError, match="404"):
        c.trigger()
    assert c.runs == []


def test_lanes_strike_no_more_faults_once_the_driver_died(tmp_path: Path) -> None:
    c, _ = chaos(tmp_path)
    struck: list[str] = []
    c.faults.inject = lambda kind: struck.append(kind) or True  # type: ignore[method-assign]
    c.faults.driving.set()
    c.faults.aborted.set()
    c.faults.lane(["clear", "api_restart"])
    assert struck == []


def test_the_ledger_on_disk_gives_the_same_oracle_as_the_one_in_memory(tmp_path: Path) -> None:
    # A harness that dies mid-soak must not take the oracle with it (`--check DIR`).
    path = tmp_path / LEDGER
    ledger = Ledger(path)
    with ledger.lock:
        ledger.record([("p0-1", '{"url": "https://a.org/1"}', "https://a.org/1"),
                       ("p0-2", "not json at all", None)], 0)
        ledger.record([("p1-1", '{"url": "https://www.b.org/2"}', "https://www.b.org/2")], 2)
    loaded = Ledger.load(path)  # read while the writer still has it open: every line is flushed
    ledger.close()
    assert loaded.valid == ledger.valid == {"p0-1": "https://a.org/1", "p1-1": "https://www.b.org/2"}
    assert loaded.malformed == ledger.malformed == {"p0-2"}
    assert loaded.duplicates == ledger.duplicates == 2
    assert loaded.url_counts() == ledger.url_counts()
    assert loaded.domain_counts() == {"a.org": 1, "b.org": 1}


def test_the_payments_ledger_on_disk_keeps_the_requests_and_the_deposits(tmp_path: Path) -> None:
    path = tmp_path / LEDGER
    ledger = Ledger(path)
    ledger.record_deposits({"acct00": 300, "acct01": 300})
    request = {"id": "pay-p0-1", "from": "acct00", "to": "acct01", "amount": 40}
    with ledger.lock:
        ledger.record([("pay-p0-1", json.dumps(request), request), ("pay-p0-2", "not json at all", None)], 1)
    ledger.record_deposits({"acct00": 50})
    loaded = Ledger.load(path)
    ledger.close()
    assert loaded.valid == ledger.valid == {"pay-p0-1": request}
    assert loaded.malformed == {"pay-p0-2"} and loaded.duplicates == 1
    assert loaded.deposits == ledger.deposits == {"acct00": 350, "acct01": 300}


def test_payments_mode_triggers_stage_one_and_operates_both_stages(tmp_path: Path) -> None:
    # Stage 2 runs on stage 1's asset events: the driver triggers only stage 1, but a failed run
    # of either is cleared, and only stage 1's runs count as the run's transactions.
    runs = {"payments": [{"dag_run_id": "p1", "state": "failed"}],
            "settlement": [{"dag_run_id": "s1", "state": "failed"}, {"dag_run_id": "s2", "state": "success"}]}
    cleared, triggered = [], []
    client = SimpleNamespace(runs=lambda dag_id: runs[dag_id],
                             clear=lambda dag_id, run_id, only_failed: cleared.append((dag_id, run_id)),
                             trigger=lambda dag_id, logical_date, run_id: triggered.append((dag_id, logical_date)))
    c = Chaos(FakeStack(tmp_path, client), ChaosConfig(seed=5, mode="payments"))  # type: ignore[arg-type]
    states = c.operate()
    assert cleared == [("payments", "p1"), ("settlement", "s1")] and c.report.operator_clears == 2
    assert set(states) == {("payments", "p1"), ("settlement", "s1"), ("settlement", "s2")}
    c.trigger()
    c.trigger("settlement")
    assert [d for d, _ in triggered] == ["payments", "settlement"] and triggered[1][1] is None
    assert c.runs == ["chaos-5-0000"]


def test_a_supervisor_restart_that_fails_is_tried_again(tmp_path: Path) -> None:
    c, stack = chaos(tmp_path)
    stack.procs["scheduler"].returncode = 1
    failures = [RuntimeError("port still in use")]
    start = stack.start_component

    def flaky_start(name: str) -> None:
        if failures:
            raise failures.pop()
        start(name)

    stack.start_component = flaky_start  # type: ignore[method-assign]
    supervisor = threading.Thread(target=c.supervisor.loop, daemon=True)
    supervisor.start()
    deadline = time.monotonic() + 15
    while "scheduler" not in stack.started and time.monotonic() < deadline:
        time.sleep(0.2)
    c.supervisor.finished.set()
    supervisor.join(10)
    assert stack.started == ["scheduler"]


def test_lanes_arm_side_by_side_and_the_run_disarms_them_all(tmp_path: Path) -> None:
    """The commit lane's held commit and the control lane's gate for a master restart are armed at
    once: arming or disarming one lane leaves the other's fault point in the file tasks read."""
    c, stack = chaos(tmp_path)
    armed = Path(stack.extra_env["AIRFLOW_TXN_FAULTS_FILE"])
    c.faults.arm("commit.after_apply:words=pause:8@once:/m")
    c.faults.arm("process.begin=waitfor:/gate", lane="control")
    assert armed.read_text().splitlines() == ["commit.after_apply:words=pause:8@once:/m", "process.begin=waitfor:/gate"]
    c.faults.arm(None)
    assert armed.read_text().splitlines() == ["process.begin=waitfor:/gate"]
    c.faults.disarm()
    assert armed.read_text() == ""


def test_an_audit_refused_for_records_the_harness_deleted_is_not_a_difference(tmp_path: Path) -> None:
    from bench.chaos.kafka import audit_refused

    ledger = Ledger(tmp_path / LEDGER)
    said = ("cannot audit chaos_kafka: topic 'chaos-tweets': retention removed committed records (partition 0 "
            "offsets 0..8810); they can no longer be recomputed")
    assert audit_refused(said, ledger) == ""  # nothing deleted by the harness: a real refusal
    ledger.record_deleted(0, 8811)
    assert "offsets 0..8810 are gone, below offset 8811" in audit_refused(said, ledger)
    assert audit_refused(said.replace("0..8810", "0..9000"), ledger) == ""  # more gone than the harness took
    assert audit_refused("chaos_kafka: 3 rows differ", ledger) == ""
    # Every partition the audit names must lie below a harness deletion, not only the first.
    two = said.replace("offsets 0..8810)", "offsets 0..8810, partition 3 offsets 0..40)")
    assert audit_refused(two, ledger) == ""
    ledger.record_deleted(3, 41)
    assert "partition 3's committed offsets 0..40 are gone, below offset 41" in audit_refused(two, ledger)


class FakeClock:
    """``time`` for the harness module: sleeping moves the clock, nothing waits."""

    def __init__(self) -> None:
        self.now = 0.0

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def draining(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, state: Any, lag: Any) -> tuple[Chaos, FakeClock]:
    """A chaos run at its drain: one run of ``words`` whose state and lag are functions of the clock."""
    from bench.chaos import harness

    clock = FakeClock()
    monkeypatch.setattr(harness, "time", clock)
    client = SimpleNamespace(runs=lambda dag_id: [{"dag_run_id": "r1", "state": state(clock.now)}],
                             trigger=lambda dag_id, logical_date, run_id: None)
    c = Chaos(FakeStack(tmp_path, client), ChaosConfig(seed=5, drain_timeout=60))  # type: ignore[arg-type]
    monkeypatch.setattr(c, "lag", lambda topology: lag(clock.now))
    return c, clock


def test_a_slow_drain_that_keeps_moving_is_not_called_stuck(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Found by CI on a loaded machine: the drain gave up after a fixed 420 s while the payments
    # stages were still committing, one every two minutes, and called the last run stuck.
    c, clock = draining(tmp_path, monkeypatch, state=lambda t: "running" if t < 200 else "success",
                        lag=lambda t: max(0, 1000 - 5 * int(t // 50)) if t < 200 else 0)
    c.drain()
    assert 200 <= clock.now < 210 and c.report.stuck_runs == 0 and not c.report.problems, (clock.now, c.report)


def test_a_drain_with_nothing_moving_reports_the_run_stuck_after_its_timeout(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    c, clock = draining(tmp_path, monkeypatch, state=lambda t: "running", lag=lambda t: 7)
    c.drain()
    assert 60 <= clock.now < 70, clock.now
    assert c.report.stuck_runs == 1 and c.report.problems == ["7 events never committed by chaos_words"]


def test_a_drain_that_moves_but_never_ends_is_cut_off(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from bench.chaos.harness import DRAIN_CAP

    c, clock = draining(tmp_path, monkeypatch, state=lambda t: "running", lag=lambda t: 7 + int(t // 2) % 2)
    c.drain()
    assert DRAIN_CAP * 60 <= clock.now < DRAIN_CAP * 60 + 10 and c.report.stuck_runs == 1, clock.now


def test_the_s3_ledger_on_disk_keeps_every_version_and_what_the_harness_did_to_it(tmp_path: Path) -> None:
    from bench.chaos.objects import record_version, version_id

    ledger = Ledger(tmp_path / LEDGER)
    with ledger.lock:
        record_version(ledger, "tweets/p0-1.json", '"e1"', [(0, "https://a.org/1"), (1, "m-0-1-1")])
        record_version(ledger, "tweets/p0-1.json", '"e2"', [(0, "https://b.org/1")])
        ledger.record([], 1)
        ledger.record_mutation(version_id("tweets/p0-1.json", '"e1"'), "overwrite")
    loaded = Ledger.load(tmp_path / LEDGER)
    ledger.close()
    assert loaded.versions == ledger.versions == {"tweets/p0-1.json@e1": ["tweets/p0-1.json@e1:0", "m-0-1-1"],
                                                  "tweets/p0-1.json@e2": ["tweets/p0-1.json@e2:0"]}
    assert loaded.mutated == {"tweets/p0-1.json@e1": "overwrite"} and loaded.mutated_keys == {"tweets/p0-1.json"}
    assert loaded.malformed == {"m-0-1-1"} and loaded.duplicates == 1
    assert loaded.url_counts() == {"https://a.org/1": 1, "https://b.org/1": 1}
    only_new = loaded.restricted_to(set(loaded.versions["tweets/p0-1.json@e2"]))
    assert only_new.url_counts() == {"https://b.org/1": 1} and not only_new.malformed


def test_an_audit_refused_for_files_the_harness_overwrote_is_not_a_difference(tmp_path: Path) -> None:
    from bench.chaos.objects import audit_refused

    ledger = Ledger(tmp_path / LEDGER)
    said = ("cannot audit chaos_s3: landing files gone or changed since they committed: "
            "s3a://chaos-landing/tweets/p0-3.json, s3a://chaos-landing/tweets/p1-7.json")
    ledger.record_mutation("tweets/p0-3.json@e1", "delete")
    assert audit_refused(said, ledger) == ""  # p1-7 was changed by no one the harness knows
    ledger.record_mutation("tweets/p1-7.json@e4", "overwrite")
    assert "tweets/p0-3.json, tweets/p1-7.json" in audit_refused(said, ledger)
    assert audit_refused("chaos_s3: 3 rows differ", ledger) == ""


def test_a_slow_link_holds_object_gets_only() -> None:
    from dev.slowlink import object_get

    assert object_get(b"GET /chaos-landing/tweets/p0-1.json HTTP/1.1\r\nHost: x\r\n")
    assert object_get(b"GET /bucket/a%20b?versionId=3 HTTP/1.1\r\n")
    assert not object_get(b"GET /chaos-landing?list-type=2&prefix=tweets%2F HTTP/1.1\r\n")
    assert not object_get(b"GET /chaos-landing/ HTTP/1.1\r\n")
    assert not object_get(b"GET / HTTP/1.1\r\n")
    assert not object_get(b"PUT /chaos-landing/tweets/p0-1.json HTTP/1.1\r\n")
    assert not object_get(b"HEAD /chaos-landing/tweets/p0-1.json HTTP/1.1\r\n")
