"""A batch quarantined (nearly) whole is not committed: the commit is refused with the top reasons
and the fix, the topology says it is blocked, and the way out -- the producer fixed and the txid
processed again, or the limit raised -- commits it, exactly once."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest

from airflow_transactional import quarantine
from airflow_transactional.coordinator import Coordinator
from airflow_transactional.exceptions import ConfigError, QuarantineOverLimit
from airflow_transactional.processing import process_batch
from tests.helpers import click, click_fn, counting_topology, make_log, query, table

pytestmark = pytest.mark.integration


def _ts_as_number(i: int) -> tuple[str, str]:
    """A producer after an upstream change: ``amount`` now a text the job cannot add up."""
    return f"eur-{i}", json.dumps({"user": f"u{i % 3}", "amount": f"{i} EUR"})


def test_a_batch_quarantined_over_its_limit_is_refused_with_the_reason_and_the_fix(coordinator: Coordinator,
                                                                                    dsn: str) -> None:
    log = make_log(dsn, "clicks", partitions=1)
    coordinator.register(counting_topology(max_batch_size=100))
    log.append([_ts_as_number(i) for i in range(27)] + [click(i) for i in range(3)])
    txn = coordinator.plan("clicks", "r1")
    assert process_batch(coordinator, "clicks", txn.txid, click_fn).quarantined == 27

    with pytest.raises(QuarantineOverLimit) as refused:
        coordinator.commit("clicks", txn.txid)
    said = str(refused.value)
    assert "txid 1 attempt 1 quarantined 27 of its 30 records (90%), over its max_quarantined of 50%" in said
    assert "27 x ValueError: invalid literal for int() with base 10: …" in said, said  # grouped, not one per value
    # The commit groups as the quarantine page does (the same template in SQL and in Python).
    reasons = [r for (r,) in query(dsn, "SELECT reason FROM airflow_txn.quarantine")]
    assert {quarantine.template(r) for r in reasons} == {"ValueError: invalid literal for int() with base 10: …"}
    assert "clear the run's process task" in said and "max_quarantined higher (or None)" in said
    assert isinstance(refused.value, ConfigError)  # the task fails for good: a retry meets the same records
    st = coordinator.status("clicks")
    assert st.committed_txid == 0 and table(dsn, "clicks_count") == {}
    # The commit task marks the txid failed for good (a ConfigError); the overview then says what it is.
    coordinator.mark_failed("clicks", txn.txid, f"commit: {said}")
    summary = coordinator.summary("clicks", dag_id="clicks", now=datetime.now(UTC))
    assert [f["phase"] for f in summary["in_flight"]] == ["staged, its commit failed for good"]
    assert "over its max_quarantined of 50%" in summary["blocked_by"]
    coordinator.lift_failed("clicks", txn.txid)  # as a cleared commit task does

    # The limit raised (the owner re-registers the declaration): the same attempt commits, once.
    coordinator.register(counting_topology(max_batch_size=100, max_quarantined=None))
    assert coordinator.commit("clicks", txn.txid).committed
    assert coordinator.status("clicks").quarantined == 27
    assert table(dsn, "clicks_count") == {"u0": 1, "u1": 1, "u2": 1}
    log.close()


def test_a_few_bad_records_and_small_batches_commit_as_before(coordinator: Coordinator, dsn: str) -> None:
    log = make_log(dsn, "clicks", partitions=1)
    coordinator.register(counting_topology(max_batch_size=100))
    half = [_ts_as_number(i) for i in range(10)] + [click(i) for i in range(10)]  # half: not over it
    few = [_ts_as_number(i) for i in range(100, 119)]  # all bad, but 19 records: too few to judge
    for run, records in (("a", half), ("b", few)):
        log.append(records)
        txn = coordinator.plan("clicks", run)
        process_batch(coordinator, "clicks", txn.txid, click_fn)
        assert coordinator.commit("clicks", txn.txid).committed
    assert coordinator.status("clicks").quarantined == 29
    log.close()


def test_a_quarantine_share_rising_towards_the_limit_is_a_warning_before_it_is_a_refusal(
        coordinator: Coordinator, dsn: str) -> None:
    # A producer's change reaching part of its fleet: 30% of a batch set aside commits (under the
    # limit of 50%), and nothing said so -- the overview said "blocked by: nothing".
    from airflow_transactional.airflow.ui import pages

    log = make_log(dsn, "clicks", partitions=1)
    coordinator.register(counting_topology(max_batch_size=100))
    log.append([_ts_as_number(i) for i in range(9)] + [click(i) for i in range(21)])
    txn = coordinator.plan("clicks", "r1")
    process_batch(coordinator, "clicks", txn.txid, click_fn)
    assert coordinator.commit("clicks", txn.txid).committed
    st = coordinator.status("clicks")
    assert st.blocked_by is None and st.quarantine_warning is not None
    assert "quarantining 30% of what its latest txids read (9 of 30 records), past half its max_quarantined of " \
           "50%" in st.quarantine_warning
    summary = coordinator.summary("clicks", dag_id="clicks", now=datetime.now(UTC))
    overview = pages.transactions("/transactional", [summary])
    assert "quarantining 30%" in overview and "<span class=ok>nothing</span>" not in overview
    assert "Warning: quarantining 30%" in pages.topology("/transactional", summary, [], datetime.now(UTC))

    log.append([click(i) for i in range(100, 160)])  # the producer fixed: the share falls, so does the warning
    txn = coordinator.plan("clicks", "r2")
    process_batch(coordinator, "clicks", txn.txid, click_fn)
    coordinator.commit("clicks", txn.txid)
    assert coordinator.status("clicks").quarantine_warning is None  # 9 of 90
    coordinator.register(counting_topology(max_batch_size=100, max_quarantined=None))
    log.append([_ts_as_number(i) for i in range(200, 280)])
    txn = coordinator.plan("clicks", "r3")
    process_batch(coordinator, "clicks", txn.txid, click_fn)
    coordinator.commit("clicks", txn.txid)
    assert coordinator.status("clicks").quarantine_warning is None  # opted out: it expects it
    log.close()


@pytest.mark.parametrize("share", [0, -0.1, 1.5, "half", True])
def test_max_quarantined_is_a_share_of_a_batch(share: object) -> None:
    with pytest.raises(ConfigError, match=r"max_quarantined must be a share of a batch's records above 0 and at "
                                          r"most 1 \(e\.g\. 0\.5"):
        counting_topology(max_quarantined=share)  # type: ignore[arg-type]
