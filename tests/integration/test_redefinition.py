"""core/redefinition.py: a live state declared at a higher version is built beside the live one while
the topology commits, switched in at one txid in its place, and the old version archived -- its
table and delta history kept, answering ``state --as-of`` for the txids it was live."""

from __future__ import annotations

import json
from typing import Any

import pytest

from airflow_transactional.coordinator import Coordinator, StateBuild
from airflow_transactional.exceptions import ConfigError, DeclarationChanged, StaleAttempt
from airflow_transactional.processing import audit, process_batch, python_fold
from airflow_transactional.spec import StateSpec, TopologySpec
from tests.helpers import click, click_fn, counting_topology, make_log, query, run_one

pytestmark = pytest.mark.integration

#: Version 2 of ``clicks_amount``: the amounts per user *and* size, as numeric -- keys and value type changed.
V2 = StateSpec("clicks_amount", {"user_id": "text", "size": "text"}, combiner="sum", value_type="numeric",
               version=2)


def size(amount: int) -> str:
    return "big" if amount >= 5 else "small"


def v2_fn(rec: dict[str, Any]) -> list[tuple[str, tuple[Any, ...], Any]]:
    """The job once the DAG file redefines the state: the new transform under the state's name, the
    old one's rows as ``clicks_amount@1`` until the switch."""
    user, amount = rec["user"], int(rec["amount"])
    return [("clicks_count", (user,), 1), ("clicks_amount", (user, size(amount)), amount),
            ("clicks_amount@1", (user,), amount)]


def redefined(**kwargs: Any) -> TopologySpec:
    config = counting_topology(**kwargs).to_config()
    config["states"] = [config["states"][0], V2.to_config()]
    return TopologySpec.from_config(config)


def events(dsn: str, below: int | None = None) -> list[dict[str, Any]]:
    """The log's records (those of the clicks numbered below ``below``: all)."""
    found = query(dsn, "SELECT event_id, payload FROM airflow_txn.log_events WHERE log_name = 'clicks'")
    return [json.loads(p) for e, p in found if below is None or int(e.removeprefix("ev-")) < below]


def v1_oracle(records: list[dict[str, Any]]) -> list[tuple[str, int]]:
    total: dict[str, int] = {}
    for r in records:
        total[r["user"]] = total.get(r["user"], 0) + int(r["amount"])
    return sorted(total.items())


def v2_oracle(records: list[dict[str, Any]]) -> list[tuple[str, str, int]]:
    total: dict[tuple[str, str], int] = {}
    for r in records:
        key = (r["user"], size(int(r["amount"])))
        total[key] = total.get(key, 0) + int(r["amount"])
    return sorted((u, s, v) for (u, s), v in total.items())


def rows(dsn: str, sql: str) -> list[tuple[Any, ...]]:
    return [tuple(int(c) if not isinstance(c, str) else c for c in row) for row in query(dsn, sql)]


def _redefine_while_committing(dsn: str, coord: Coordinator) -> tuple[int, int]:
    """Three txids committed, the state redefined (declared, then built while a txid commits, one
    attempt left uncommitted across the switch); the txid switched at and the uncommitted one."""
    log = make_log(dsn)
    log.append([click(i) for i in range(30)])
    coord.register(counting_topology())
    run_one(coord, "clicks", "r1")
    # The same version with other keys is drift, and the refusal names the way: a version.
    config = redefined().to_config()
    config["states"][1].pop("version")
    with pytest.raises(DeclarationChanged, match="declare it with version=2"):
        coord.register(TopologySpec.from_config(config))
    coord.register(redefined())
    st = coord.evolution("clicks")
    assert st["declared"] == ["clicks_amount__v2"]
    assert st["labels"]["clicks_amount__v2"] == "clicks_amount version 2 (redefines version 1)"
    assert "declared clicks_amount version 2" in (coord.status("clicks").evolving or "")
    # Declared: the job's new rows are dropped, its old transform's (clicks_amount@1) keep the live version.
    log.append([click(i) for i in range(30, 40)])
    run_one(coord, "clicks", "r2", v2_fn)
    assert rows(dsn, "SELECT user_id, value FROM clicks_amount ORDER BY 1") == v1_oracle(events(dsn))
    with pytest.raises(ConfigError, match="as 'clicks_amount@1'"):
        from airflow_transactional.spark.batch import transformed  # the Spark job's check, without Spark
        transformed(coord.spec("clicks"), lambda _df: {"clicks_count": 1, "clicks_amount": 2}, None)
    inner = python_fold(coord, coord.spec("clicks"), v2_fn)
    during: list[int] = []

    def fold_while_committing(batch: Any, target: Any) -> Any:
        if not during:  # commits go on while the history is folded; one attempt is left uncommitted
            log.append([click(i) for i in range(40, 50)])
            during.append(run_one(Coordinator(dsn), "clicks", "r3", v2_fn))
            log.append([click(i, amount=9) for i in range(50, 55)])
            txn = coord.plan("clicks", "r4")
            process_batch(coord, "clicks", txn.txid, v2_fn)
            during.append(txn.txid)
        return inner(batch, target)

    result = coord.recompute(StateBuild("clicks"), fold_while_committing)
    assert result["switched_at_txid"] == during[0]
    return during[0], during[1]


def test_a_state_redefined_is_built_beside_the_live_one_switched_in_and_the_old_version_archived(dsn: str) -> None:
    coord = Coordinator(dsn)
    try:
        switched, stale = _redefine_while_committing(dsn, coord)
        through_switch = events(dsn, 50)  # what txids 1..switched read
        # The new version is the fold of every record through the switch under the new code...
        assert rows(dsn, "SELECT user_id, size, value FROM clicks_amount ORDER BY 1, 2") == v2_oracle(through_switch)
        # ...the old one is archived as it was at the switch, its table beside.
        assert rows(dsn, "SELECT user_id, value FROM clicks_amount_v1 ORDER BY 1") == v1_oracle(through_switch)
        st = coord.evolution("clicks")
        assert st["retired"] == {"clicks_amount__v1": switched} and not st["building"] and not st["declared"]
        assert st["built"]["clicks_amount"] == switched
        assert coord.spec("clicks").state("clicks_amount").version == 2
        # An attempt that began before the switch staged the old version under the state's name: refused.
        with pytest.raises(StaleAttempt, match="clicks_amount"):
            coord.commit("clicks", stale)
        process_batch(coord, "clicks", stale, v2_fn)
        assert coord.commit("clicks", stale).committed
        assert rows(dsn, "SELECT user_id, size, value FROM clicks_amount ORDER BY 1, 2") == v2_oracle(events(dsn))
        assert rows(dsn, "SELECT user_id, value FROM clicks_amount_v1 ORDER BY 1") == v1_oracle(through_switch)
        # The history answers on both sides of the switch: the archive through it, the new version after.
        assert [(u, int(v)) for u, v in coord.state_as_of("clicks", "clicks_amount", switched)] == \
            v1_oracle(through_switch)
        assert [(u, s, int(v)) for u, s, v in coord.state_as_of("clicks", "clicks_amount", stale)] == \
            v2_oracle(events(dsn))
        assert [(u, int(v)) for u, v in coord.state_as_of("clicks", "clicks_amount", 1)] == v1_oracle(events(dsn, 30))
        assert {len(r) for r in coord.changes("clicks", switched)["clicks_amount"]} == {2}  # version 1's deltas
        # The audit recomputes the new version from the source and agrees; the DAG file registers unchanged.
        assert audit(coord, "clicks", v2_fn)["differences"] == 0
        coord.register(redefined())
        make_log(dsn).append([click(i) for i in range(55, 60)])
        run_one(coord, "clicks", "r5", v2_fn)  # the job may still return clicks_amount@1: kept by nothing
        assert rows(dsn, "SELECT user_id, size, value FROM clicks_amount ORDER BY 1, 2") == v2_oracle(events(dsn))
        # Archived, not dropped -- until the owner says so.
        assert '"public"."clicks_amount_v1"' in coord.drop_retired("clicks", "clicks_amount__v1")
        assert not query(dsn, "SELECT to_regclass('public.clicks_amount_v1')")[0][0]
        with pytest.raises(ConfigError, match="txid"):
            coord.state_as_of("clicks", "clicks_amount", 1)
    finally:
        coord.close()


def test_a_redefinition_is_refused_where_it_cannot_be_exact(dsn: str) -> None:
    make_log(dsn).append([click(i) for i in range(10)])
    coord = Coordinator(dsn)
    try:
        coord.register(counting_topology())
        run_one(coord, "clicks", "r1", click_fn)
        query(dsn, "CREATE TABLE clicks_amount_v1 (x int)")  # where the switch would archive the live version
        coord.register(redefined())
        with pytest.raises(ConfigError, match="clicks_amount_v1 is there"):
            coord.recompute(StateBuild("clicks"), python_fold(coord, coord.spec("clicks"), v2_fn))
        assert coord.evolution("clicks")["declared"] == ["clicks_amount__v2"]  # nothing began
        query(dsn, "DROP TABLE clicks_amount_v1")
        coord.recompute(StateBuild("clicks"), python_fold(coord, coord.spec("clicks"), v2_fn))
        assert coord.spec("clicks").state("clicks_amount").version == 2
        with pytest.raises(DeclarationChanged, match="version 2 -> 1"):
            coord.register(counting_topology())  # back to version 1 once 2 is live
    finally:
        coord.close()
