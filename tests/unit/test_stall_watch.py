"""The stall watch's rules on fakes of the store and of Airflow: who is stalled, what Airflow says
the next txid waits for, one alert per stall, the gauges of every check (the e2e tier runs it on
a real stack: tests/e2e/test_operations.py)."""

from __future__ import annotations

import contextlib
import dataclasses
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace
from typing import Any

import pytest

from airflow_transactional.exceptions import ConfigError
from airflow_transactional.model import InFlight, TopologyStatus

pytestmark = pytest.mark.unit

NOW = datetime(2026, 11, 27, 12, 0, tzinfo=UTC)
ALERTS: list[dict[str, Any]] = []


def record_alert(**kwargs: Any) -> None:
    ALERTS.append(kwargs)


def status(topology_id: str, *, stalled: bool, run_key: str = "scheduled__1", planned_ago: float = 600
           ) -> TopologyStatus:
    nxt = InFlight(8, run_key, "planned", 1, 0, since=NOW - timedelta(seconds=planned_ago))
    return TopologyStatus(topology_id, 7, {"0": 10}, NOW - timedelta(seconds=900), [nxt], 120,
                          "stalled: no commit for 15 min ..." if stalled else None, 0, 0, 0, stalled=stalled)


@dataclass
class FakeTI:
    previous: dict[str, str] | None = None
    states: dict[str, dict[str, str]] = field(default_factory=dict)
    pushed: dict[str, Any] = field(default_factory=dict)
    alerted: dict[str, list[int]] | None = None  # the failed checks the previous check alerted on
    warned: list[str] | None = None  # the topologies the previous check warned of a rising quarantine

    def xcom_pull(self, **kwargs: Any) -> Any:
        assert kwargs["include_prior_dates"] and kwargs["map_indexes"] == -1  # one value: the latest check's
        return {"stalled": self.previous, "quarantine_rising": self.warned}.get(kwargs["key"], self.alerted)

    def xcom_push(self, key: str, value: Any) -> None:
        self.pushed[key] = value

    def get_task_states(self, *, dag_id: str, run_ids: list[str]) -> dict[str, dict[str, str]]:
        return {r: self.states[r] for r in run_ids if r in self.states}


@pytest.fixture
def watch(monkeypatch: pytest.MonkeyPatch) -> Any:
    from airflow_transactional.airflow import metrics, stalls

    statuses = {"words": status("words", stalled=True), "orders": status("orders", stalled=False)}
    specs = [SimpleNamespace(topology_id=t, dag=f"dag_{t}") for t in statuses]
    checks = {t: {"verified_through": 0, "failures": [], "counts": {"pending": 7}} for t in statuses}
    coordinator = SimpleNamespace(topologies=lambda: specs, status=lambda t, **_: statuses[t],
                                  verify_status=lambda t, *_: checks[t], ask_lags=lambda ids: None, close=lambda: None)
    monkeypatch.setattr(stalls, "TransactionalHook", lambda conn_id: SimpleNamespace(
        coordinator=lambda: contextlib.nullcontext(coordinator)))
    monkeypatch.setattr(stalls, "datetime", SimpleNamespace(now=lambda tz: NOW, fromisoformat=datetime.fromisoformat))
    gauges: list[tuple[str, float]] = []
    monkeypatch.setattr(metrics, "_stats", lambda: SimpleNamespace(
        gauge=lambda name, value, tags: gauges.append((name, value))))
    ALERTS.clear()
    op = stalls.StallWatchOperator(task_id="check", on_stall=f"{__name__}.record_alert")
    return SimpleNamespace(op=op, gauges=gauges, statuses=statuses, checks=checks)


def test_a_check_alerts_once_per_stall_with_what_airflow_says_the_next_txid_waits_for(watch: Any) -> None:
    ti = FakeTI(states={"scheduled__1": {"plan": "success", "process": "scheduled", "commit": None}})
    watch.op.execute({"ti": ti})
    assert len(ALERTS) == 1 and ALERTS[0]["topology_id"] == "words"
    assert ALERTS[0]["stalled_seconds"] == 900  # since the last commit
    assert ALERTS[0]["reason"].endswith("; Airflow: its process task is scheduled: waiting for a slot of its pool "
                                        "or the scheduler's limits")
    assert ("transactional.words.stalled", 1) in watch.gauges
    assert ("transactional.words.stall_seconds", 900) in watch.gauges
    assert ("transactional.orders.stalled", 0) in watch.gauges
    assert ti.pushed["stalled"] == {"words": (NOW - timedelta(seconds=900)).isoformat()}
    # The next check, still stalled: the gauges again, no second alert.
    watch.gauges.clear()
    watch.op.execute({"ti": FakeTI(previous=ti.pushed["stalled"])})
    assert len(ALERTS) == 1 and ("transactional.words.stalled", 1) in watch.gauges
    # It committed: 0, and a later stall alerts again.
    watch.statuses["words"] = status("words", stalled=False)
    later = FakeTI(previous=ti.pushed["stalled"])
    watch.op.execute({"ti": later})
    assert later.pushed["stalled"] == {} and ("transactional.words.stalled", 0) in watch.gauges
    watch.statuses["words"] = status("words", stalled=True)
    again = FakeTI(previous=later.pushed["stalled"])
    watch.op.execute({"ti": again})
    assert len(ALERTS) == 2
    # It committed and stalled again between two checks: a new stall (since a later commit), alerted.
    later_commit = NOW - timedelta(seconds=700)
    watch.statuses["words"] = dataclasses.replace(status("words", stalled=True), last_commit_at=later_commit)
    watch.op.execute({"ti": FakeTI(previous=again.pushed["stalled"])})
    assert len(ALERTS) == 3 and ALERTS[2]["stalled_seconds"] == 700


def test_a_topology_blocked_by_a_batch_over_its_quarantine_limit_alerts_once(watch: Any) -> None:
    """A txid whose commit was refused for its quarantine share fails for good: the topology does not
    move until someone acts, so the watch alerts on it as on a stall, with the refusal as the reason."""
    refused = ("blocked by failed txid 8 (run scheduled__1): commit: topology 'orders' txid 8 attempt 1 "
               "quarantined 600 of its 600 records (100%), over its max_quarantined of 50%: not committed")
    watch.statuses["orders"] = dataclasses.replace(status("orders", stalled=False), blocked_by=refused)
    ti = FakeTI()
    watch.op.execute({"ti": ti})
    assert [a["topology_id"] for a in ALERTS] == ["words", "orders"]
    assert ALERTS[1]["reason"].startswith(refused) and ("transactional.orders.stalled", 1) in watch.gauges
    watch.op.execute({"ti": FakeTI(previous=ti.pushed["stalled"])})
    assert len(ALERTS) == 2  # the same block: no second alert


def test_a_failed_check_of_the_shadow_audit_alerts_once_naming_txid_state_and_keys(watch: Any) -> None:
    watch.statuses["words"] = status("words", stalled=False)
    failed = {"txid": 5, "detail": {"differences": {"url_counts": {"samples": [{"key": "https://a/1"}]}}}}
    watch.checks["orders"] = {"verified_through": 4, "failures": [failed], "counts": {"verified": 4, "failed": 1}}
    ti = FakeTI()
    watch.op.execute({"ti": ti})
    [alert] = ALERTS
    assert alert["topology_id"] == "orders" and alert["stalled_seconds"] == 0.0
    assert "  txid 5: recomputed, it differs (url_counts: https://a/1)" in alert["reason"]
    assert ("transactional.orders.verification_failures", 1) in watch.gauges
    assert ("transactional.orders.verified_through", 4) in watch.gauges
    assert not any(name.startswith("transactional.words.verif") for name, _v in watch.gauges)  # no audit there
    assert ti.pushed["failed_checks"] == {"orders": [5]}
    watch.op.execute({"ti": FakeTI(alerted=ti.pushed["failed_checks"])})  # the same failure: no second alert
    assert len(ALERTS) == 1


def test_a_source_whose_lag_is_unknown_is_stalled_when_nothing_commits() -> None:
    """Regression: a Kafka topology whose broker was out of reach showed lag 0 (unknown), so the
    stall rule never held and the watch never alerted."""
    from airflow_transactional.core.liveness import stalled

    quiet = dataclasses.replace(status("kafka", stalled=False), lag=0,
                                source_error="Kafka at 127.0.0.1:9 did not answer")
    said = stalled(quiet, 300, NOW)
    assert said is not None and "while the source's lag is unknown (Kafka at 127.0.0.1:9 did not answer)" in said
    assert stalled(dataclasses.replace(quiet, source_error=None), 300, NOW) is None  # known to hold nothing: idle


def test_a_failing_alert_or_an_unreadable_topology_does_not_blind_the_check(watch: Any) -> None:
    def broken(**kwargs: Any) -> None:
        raise RuntimeError("the pager is down")

    watch.op.on_stall = broken
    ti = FakeTI()
    watch.op.execute({"ti": ti})
    assert "words" in ti.pushed["stalled"]
    del watch.statuses["orders"]  # its status raises (KeyError here; a dropped table in real life)
    watch.op.on_stall = f"{__name__}.record_alert"
    watch.op.execute({"ti": FakeTI()})
    assert [a["topology_id"] for a in ALERTS] == ["words"]


@pytest.mark.parametrize(("states", "said"), [
    ({"plan": "success", "process": "queued"}, "Airflow: its process task is queued: waiting for a worker to start it"),
    ({"plan": "success", "process": "success", "commit": "deferred"},
     "Airflow: its commit task waits in the triggerer for its turn"),
    ({"plan": "success", "process": "up_for_retry"}, "Airflow: its process task failed a try and waits for its retry"),
    ({"plan": None}, "Airflow: its plan task has not been scheduled yet"),
    ({"plan": "success", "process": "success", "commit": "success"}, None),
])
def test_airflow_says_what_the_first_unfinished_task_waits_for(states: dict[str, str | None],
                                                                 said: str | None) -> None:
    from airflow_transactional.airflow.stalls import airflow_says

    assert airflow_says(states) == said


def test_a_wrong_callback_or_topology_list_is_refused_when_the_dag_is_parsed() -> None:
    from airflow_transactional import stall_watch_dag

    with pytest.raises(ConfigError, match=r"cannot be imported.*my_alerts\.page_on_call"):
        stall_watch_dag(on_stall="no_such_module.page")
    with pytest.raises(ConfigError, match="function or its dotted path"):
        stall_watch_dag(on_stall="datetime.MAXYEAR")
    with pytest.raises(ConfigError, match="list of topology ids"):
        stall_watch_dag(topologies="words")
    dag = stall_watch_dag(on_stall=f"{__name__}.record_alert", topologies=["words"])
    assert dag.max_active_runs == 1 and not dag.catchup and [t.task_id for t in dag.tasks] == ["check"]


def test_a_rising_quarantine_share_is_alerted_once_until_it_falls(watch: Any) -> None:
    warning = "quarantining 34% of what its latest txids read (340 of 1,000 records), past half ..."
    watch.statuses["orders"] = dataclasses.replace(watch.statuses["orders"], quarantine_warning=warning)
    ti = FakeTI()
    watch.op.execute({"ti": ti})
    assert [(a["topology_id"], a["reason"], a["stalled_seconds"]) for a in ALERTS if a["topology_id"] == "orders"] \
        == [("orders", warning, 0.0)]
    assert ti.pushed["quarantine_rising"] == ["orders"]
    ALERTS.clear()
    watch.op.execute({"ti": FakeTI(warned=["orders"])})  # still rising: warned before, no second alert
    assert not [a for a in ALERTS if a["topology_id"] == "orders"]
    watch.statuses["orders"] = dataclasses.replace(watch.statuses["orders"], quarantine_warning=None)
    fell = FakeTI(warned=["orders"])
    watch.op.execute({"ti": fell})
    assert fell.pushed["quarantine_rising"] == []  # fell: a rise after this alerts again
