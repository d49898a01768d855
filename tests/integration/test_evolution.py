"""core/evolution.py: a state added to a running topology is declared until approved, then built
from the source's history while the topology keeps committing and switched in at one txid --
equal to the fold of every committed record, and maintained by every commit after."""

from __future__ import annotations

import json
import threading
from typing import Any

import pytest

from airflow_transactional.coordinator import Coordinator, StateBuild
from airflow_transactional.core import evolution
from airflow_transactional.exceptions import ConfigError, DeclarationChanged, StaleAttempt
from airflow_transactional.processing import audit, build, process_batch, python_fold
from airflow_transactional.sources import EventLog
from airflow_transactional.spec import StateSpec, TopologySpec
from tests.helpers import click, click_fn, counting_topology, make_log, query, run_one, table
from tests.integration.test_privileges import Roles, _feed, roles  # noqa: F401 -- roles: the fixture

pytestmark = pytest.mark.integration

BIG = StateSpec("clicks_big", {"user_id": "text"}, combiner="sum")


def evolved_fn(rec: dict[str, Any]) -> list[tuple[str, tuple[Any, ...], Any]]:
    """The job's transform once the DAG file adds ``clicks_big``: each user's amounts of 5 or more."""
    amount = int(rec["amount"])
    return [*click_fn(rec), *([("clicks_big", (rec["user"],), amount)] if amount >= 5 else [])]


def evolved(**kwargs: Any) -> TopologySpec:
    spec = counting_topology(**kwargs)
    return TopologySpec.from_config({**spec.to_config(), "states": [*spec.to_config()["states"],
                                                                     BIG.to_config()]})


def big_oracle(dsn: str) -> list[tuple[str, int]]:
    """Each user's sum of amounts of 5 or more over every record of the log, read apart from the provider."""
    total: dict[str, int] = {}
    for (payload,) in query(dsn, "SELECT payload FROM airflow_txn.log_events WHERE log_name = %s", ("clicks",)):
        rec = json.loads(payload)
        if int(rec["amount"]) >= 5:
            total[rec["user"]] = total.get(rec["user"], 0) + int(rec["amount"])
    return sorted(total.items())


def big(dsn: str) -> list[tuple[str, int]]:
    return [(u, int(v)) for u, v in query(dsn, "SELECT user_id, value FROM clicks_big ORDER BY 1")]


def test_a_state_added_is_built_from_history_while_commits_go_on_and_switched_in_at_one_txid(dsn: str) -> None:
    log = make_log(dsn)
    log.append([click(i) for i in range(40)])
    coord = Coordinator(dsn)
    try:
        coord.register(counting_topology(max_batch_size=20))
        run_one(coord, "clicks", "r1")
        run_one(coord, "clicks", "r2")
        # The DAG file adds a state: kept as declared, nothing else changes; its rows are dropped.
        coord.register(evolved(max_batch_size=20))
        assert coord.evolution("clicks")["declared"] == ["clicks_big"]
        log.append([click(i) for i in range(40, 60)])
        run_one(coord, "clicks", "r3", evolved_fn)
        assert not query(dsn, "SELECT to_regclass('public.clicks_big')")[0][0]
        # A txid planned and processed before the approval commits while the build waits for it.
        log.append([click(i, amount=99 if i == 61 else None) for i in range(60, 80)])
        early = coord.plan("clicks", "r4")
        process_batch(coord, "clicks", early.txid, evolved_fn)
        threading.Timer(1.5, coord.commit, ("clicks", early.txid)).start()

        inner = python_fold(coord, coord.spec("clicks"), evolved_fn)
        during: list[int] = []

        def fold_while_committing(batch: Any, target: Any) -> Any:
            if not during:  # the topology keeps committing while the history is folded
                log.append([click(i) for i in range(80, 100)])
                during.append(run_one(Coordinator(dsn), "clicks", "r5", evolved_fn))
            return inner(batch, target)

        result = coord.recompute(StateBuild("clicks"), fold_while_committing)
        assert result["built_at_txid"] == early.txid  # the last txid planned when it was approved
        assert result["switched_at_txid"] == during[0]
        assert result["journal_txids"] == 1
        assert big(dsn) == big_oracle(dsn)  # the fold of every committed record, exactly
        status = coord.evolution("clicks")
        assert status["built"] == {"clicks_big": early.txid} and not status["building"] and not status["declared"]
        # From the switch on, every commit maintains it.
        log.append([click(i, user="u-new", amount=7) for i in range(100, 105)])
        run_one(coord, "clicks", "r6", evolved_fn)
        assert big(dsn) == big_oracle(dsn)
        assert ("u-new", 35) in big(dsn)
        # What the audit recomputes from the source agrees, and the history answers from M on.
        assert audit(coord, "clicks", evolved_fn)["differences"] == 0
        as_of = coord.state_as_of("clicks", "clicks_big", during[0])
        assert [(u, int(v)) for u, v in as_of] == [row for row in big(dsn) if row[0] != "u-new"]
        with pytest.raises(ConfigError, match="built from the source as of txid"):
            coord.state_as_of("clicks", "clicks_big", early.txid - 1)
        # A correction cannot reach into the snapshot the state was built as.
        with pytest.raises(ConfigError, match="were built from the source"):
            coord.plan_correction("clicks", "fix-1", 1, early.txid)
        # The DAG file that declares it registers unchanged now.
        coord.register(evolved(max_batch_size=20))
        assert coord.spec("clicks").built == {"clicks_big": early.txid}
    finally:
        coord.close()


def test_an_attempt_that_began_before_the_switch_is_not_committed_without_the_new_state(dsn: str) -> None:
    log = make_log(dsn)
    log.append([click(i) for i in range(20)])
    coord, old_job = Coordinator(dsn), Coordinator(dsn)
    try:
        coord.register(counting_topology(max_batch_size=20))
        run_one(coord, "clicks", "r1")
        coord.register(evolved(max_batch_size=20))
        before = old_job.spec("clicks")  # what a job that started before the approval read
        evolution.begin(coord.store, "clicks")
        log.append([click(i) for i in range(20, 30)])
        txn = coord.plan("clicks", "r2")
        old_job.spec = lambda _topology: before  # type: ignore[method-assign]
        process_batch(old_job, "clicks", txn.txid, evolved_fn)  # it drops the state's rows: declared, it read
        build(coord, "clicks", evolved_fn)  # taken up where begin left it; r2 is not committed yet
        with pytest.raises(StaleAttempt, match="did not stage states \\['clicks_big'\\]"):
            coord.commit("clicks", txn.txid)
        process_batch(coord, "clicks", txn.txid, evolved_fn)  # processed again, it commits
        assert coord.commit("clicks", txn.txid).committed
        assert big(dsn) == big_oracle(dsn)
    finally:
        coord.close()
        old_job.close()


def test_a_declaration_is_kept_apart_from_what_may_not_change_and_a_build_can_be_cancelled(dsn: str) -> None:
    log = make_log(dsn)
    log.append([click(i) for i in range(20)])
    coord = Coordinator(dsn)
    try:
        coord.register(counting_topology())
        run_one(coord, "clicks", "r1")
        changed = counting_topology().to_config()
        changed["states"][0]["combiner"] = "sum"
        with pytest.raises(DeclarationChanged, match="combiner 'count' -> 'sum'"):
            coord.register(TopologySpec.from_config(changed))
        coord.register(evolved())
        coord.register(counting_topology())  # the DAG file drops it again: forgotten, nothing was built
        assert coord.evolution("clicks")["declared"] == []
        coord.register(evolved())
        # Approved, then cancelled before the switch: declared again, its tables gone, commits go on.
        started = evolution.begin(coord.store, "clicks")
        assert coord.evolution("clicks")["building"] == ["clicks_big"]
        with pytest.raises(ConfigError, match="being built"):
            coord.plan_correction("clicks", "fix-1", 1, 1)
        log.append([click(i) for i in range(20, 30)])
        run_one(coord, "clicks", "r2", evolved_fn)
        evolution.rebuild.release(coord.store, "clicks")
        assert coord.cancel_build("clicks") == ["clicks_big"]
        with pytest.raises(Exception, match="cancelled or replaced"):
            evolution.switch(coord.store, started)
        assert coord.evolution("clicks")["declared"] == ["clicks_big"]
        run_one(coord, "clicks", "r3", evolved_fn)
        assert not query(dsn, "SELECT to_regclass('public.clicks_big')")[0][0]
    finally:
        coord.close()


def test_a_state_the_owner_adds_is_staged_and_then_kept_by_the_runtime_role_without_a_new_grant(
        roles: Roles) -> None:  # noqa: F811 -- the fixture imported above
    """The build's staging table and the new state's table get the grants the topology's others
    have: the run-time role's attempts go on through the build, and its commits keep the state after."""
    def grown(rec: dict[str, object]) -> list[object]:
        return [*_feed(rec), ("clicks_big", (rec["user"],), rec["amount"])]

    EventLog(roles.dsn_of("producer"), "clicks").append([click(i) for i in range(30)])
    runtime, owner = Coordinator(roles.dsn_of("runtime")), Coordinator(roles.dsn_of("owner"))
    try:
        txn = runtime.plan("clicks", "r1")
        process_batch(runtime, "clicks", txn.txid, _feed)
        assert runtime.commit("clicks", txn.txid).committed
        config = owner.spec("clicks").to_config()
        added = TopologySpec.from_config({**config, "states": [*config["states"], StateSpec(
            "clicks_big", {"user_id": "text"}).to_config()]})
        with pytest.raises(ConfigError, match="only the schema's owner may do"):
            runtime.register(added)  # a declaration is the owner's to register
        owner.register(added)
        evolution.begin(owner.store, "clicks")
        EventLog(roles.dsn_of("producer"), "clicks").append([click(i) for i in range(30, 40)])
        txn = runtime.plan("clicks", "r2")
        process_batch(runtime, "clicks", txn.txid, grown)  # stages the building state, as the run-time role
        assert runtime.commit("clicks", txn.txid).committed
        build(owner, "clicks", grown)
        EventLog(roles.dsn_of("producer"), "clicks").append([click(i) for i in range(40, 50)])
        txn = runtime.plan("clicks", "r3")
        process_batch(runtime, "clicks", txn.txid, grown)
        assert runtime.commit("clicks", txn.txid).committed  # applies the new state, as the run-time role
        assert table(roles.dsn_of("runtime"), "clicks_big") == table(roles.dsn_of("runtime"), "clicks_amount")
    finally:
        runtime.close()
        owner.close()


def test_the_status_says_what_is_declared_and_building_and_a_rebuild_waits_for_the_build(dsn: str) -> None:
    from airflow_transactional.core import rebuild
    from airflow_transactional.exceptions import RebuildInProgress

    make_log(dsn).append([click(i) for i in range(20)])
    coord = Coordinator(dsn)
    try:
        coord.register(counting_topology())
        run_one(coord, "clicks", "r1")
        coord.register(evolved())
        assert "declared clicks_big (not kept until approved" in (coord.status("clicks").evolving or "")
        evolution.begin(coord.store, "clicks")
        assert "building clicks_big (folding txids 1..1" in (coord.status("clicks").evolving or "")
        evolution.rebuild.release(coord.store, "clicks")  # its process died
        assert "its build stopped" not in (coord.status("clicks").evolving or "")  # the mark stays: taken up again
        with pytest.raises(RebuildInProgress, match="is building states \\['clicks_big'\\]"):
            rebuild.begin(coord.store, "clicks")
        assert build(coord, "clicks", evolved_fn)["built_at_txid"] == 1  # taken up where it stopped
        assert coord.status("clicks").evolving is None
    finally:
        coord.close()


def test_a_state_the_dag_file_drops_is_kept_until_approved_then_retired_as_it_was(dsn: str) -> None:
    log = make_log(dsn)
    log.append([click(i) for i in range(20)])
    coord = Coordinator(dsn)
    try:
        coord.register(evolved())  # no progress yet: three live states
        run_one(coord, "clicks", "r1", evolved_fn)
        coord.register(counting_topology())  # the DAG file drops one: still kept until approved
        assert coord.evolution("clicks")["retiring"] == ["clicks_big"]
        assert "retiring clicks_big" in (coord.status("clicks").evolving or "")
        log.append([click(i) for i in range(20, 40)])
        run_one(coord, "clicks", "r2", evolved_fn)
        assert big(dsn) == big_oracle(dsn)
        assert coord.retire_states("clicks") == {"clicks_big": 2}
        # Retired at txid 2: no commit after keeps it, whether the job still returns its rows or not.
        log.append([click(i, amount=10) for i in range(40, 60)])
        run_one(coord, "clicks", "r3", evolved_fn)
        log.append([click(i, amount=10) for i in range(60, 70)])
        run_one(coord, "clicks", "r4", click_fn)
        assert sum(v for _u, v in big(dsn)) == sum(
            json.loads(p)["amount"] for (p,) in query(dsn, "SELECT payload FROM airflow_txn.log_events WHERE "
                                                      "log_name = 'clicks' AND event_id IN %s",
                                                      (tuple(f"ev-{i}" for i in range(40)),))
            if json.loads(p)["amount"] >= 5)  # as it was at txid 2
        assert coord.evolution("clicks")["retired"] == {"clicks_big": 2}
        with pytest.raises(DeclarationChanged, match="'clicks_big' was retired at txid 2"):
            coord.register(evolved())  # its name is taken until it is dropped
        assert '"public"."clicks_big"' in coord.drop_retired("clicks", "clicks_big")
        assert not query(dsn, "SELECT to_regclass('public.clicks_big')")[0][0]
        coord.register(evolved())  # the name is free again: a new state, declared
        assert coord.evolution("clicks")["declared"] == ["clicks_big"]
    finally:
        coord.close()


def test_a_reset_drops_what_a_build_and_a_retirement_left(dsn: str) -> None:
    make_log(dsn).append([click(i) for i in range(20)])
    coord = Coordinator(dsn)
    try:
        coord.register(evolved())
        run_one(coord, "clicks", "r1", evolved_fn)
        coord.register(counting_topology())
        coord.retire_states("clicks")
        dropped = coord.reset("clicks").dropped
        assert {'"public"."clicks_big"', '"airflow_txn"."stg_1_clicks_big"'} <= set(dropped)
        assert not query(dsn, "SELECT to_regclass('public.clicks_big')")[0][0]
    finally:
        coord.close()
