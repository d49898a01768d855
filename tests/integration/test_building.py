"""core/building.py: a state build folds the history in chunks of txids, each marked done in the
transaction that folds it in -- so a build whose process died goes on from the first chunk not done,
never counting one twice -- and its progress ("txid k of M", records, an ETA) reaches the status, the
CLI's account and the commit task's metrics."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from airflow_transactional.airflow import metrics
from airflow_transactional.airflow.ui import pages
from airflow_transactional.cli.spark import evolution_text
from airflow_transactional.coordinator import Coordinator, StateBuild
from airflow_transactional.core import building
from airflow_transactional.processing import python_fold
from tests.helpers import click, counting_topology, make_log, run_one
from tests.integration.test_evolution import big, big_oracle, evolved, evolved_fn

pytestmark = pytest.mark.integration


class Died(Exception):
    """The build's process, gone mid-fold."""


def test_a_build_killed_mid_fold_goes_on_from_the_first_chunk_not_done_and_says_how_far_it_is(
        dsn: str, monkeypatch: pytest.MonkeyPatch) -> None:
    log = make_log(dsn)
    coord = Coordinator(dsn)
    try:
        coord.register(counting_topology(max_batch_size=10))
        for n in range(12):  # twelve txids of history, ten records each
            log.append([click(i) for i in range(n * 10, n * 10 + 10)])
            run_one(coord, "clicks", f"r{n}")
        coord.register(evolved(max_batch_size=10))
        inner = python_fold(coord, coord.spec("clicks"), evolved_fn)
        folded: list[Any] = []

        def dies_after_four(batch: Any, target: Any) -> Any:
            if len(folded) == 4:
                raise Died
            folded.append(batch)
            return inner(batch, target)

        with pytest.raises(Died):
            coord.recompute(StateBuild("clicks"), dies_after_four)
        st = coord.status("clicks")
        assert st.build_progress is not None
        assert st.build_progress[:4] == (8, 12, 80, 120)  # chunks of two txids (20 records): four done
        assert st.build_progress.eta_seconds is not None
        assert "folding txids 1..12 of the source's history: through txid 8 of 12, 80 of 120 records, ETA" in \
            (st.evolving or "")
        account = evolution_text(coord.evolution("clicks"))
        assert "folded through txid 8 of 12 (80 of 120 records), ETA" in account
        now = datetime.now(UTC)  # the Transactions view's page of the topology says it too
        html = pages.topology("/t", coord.summary("clicks", dag_id="clicks", now=now), coord.timeline("clicks"), now)
        assert ("<p>Changing: building clicks_big (folding txids 1..12 of the source&#x27;s history: through "
                "txid 8 of 12") in html
        sent: list[tuple[str, float]] = []
        monkeypatch.setattr(metrics, "_stats", lambda: type("Stats", (), {
            "gauge": staticmethod(lambda n, v, tags: sent.append((n, v))),
            "timing": staticmethod(lambda *a, **k: None), "incr": staticmethod(lambda *a, **k: None)}))
        metrics.committed("clicks", txid=12, duration_ms=1.0, records=10, quarantined=0, lag_records=0,
                          lag_seconds=None, build=st.build_progress)
        assert ("transactional.clicks.build_through_txid", 8) in sent
        assert ("transactional.clicks.build_of_txid", 12) in sent
        # Taken up: the chunks done are not folded again, and the state counts every record once.
        folded.clear()
        result = coord.recompute(StateBuild("clicks"), lambda b, t: (folded.append(b), inner(b, t))[1])
        assert len(folded) == 2 and result["built_at_txid"] == 12  # txids 9-10 and 11-12, as planned
        assert big(dsn) == big_oracle(dsn)
        assert coord.status("clicks").build_progress is None
    finally:
        coord.close()


def test_the_history_is_split_into_about_ten_chunks_of_equal_records() -> None:
    split = building._split([(t, 10) for t in range(1, 13)])
    assert [(c.first_txid, c.last_txid, c.records) for c in split] == [
        (1, 2, 20), (3, 4, 20), (5, 6, 20), (7, 8, 20), (9, 10, 20), (11, 12, 20)]
    assert [(c.first_txid, c.last_txid) for c in building._split([(1, 0), (2, 500), (3, 0), (4, 1)])] == [
        (1, 2), (3, 4)]
    assert building._split([]) == []


def test_a_new_version_built_over_a_history_with_an_edited_replay_counts_what_the_replay_took_once(
        dsn: str) -> None:
    """The committed replays' records are the build's last chunk, each as edited: a new version of
    ``clicks_amount`` (the same keys and parse, twice the amount) equals twice the live one, the
    record fixed by hand and replayed included."""
    from airflow_transactional.processing import process_batch
    from airflow_transactional.spec import TopologySpec
    from tests.helpers import query, table
    from tests.integration.test_recompute import _committed
    from tests.integration.test_replays import strict

    def doubled(rec: dict[str, Any]) -> list[tuple[str, tuple[Any, ...], Any]]:
        count, (_name, key, amount) = strict(rec)
        return [count, ("clicks_amount", key, 2 * amount), ("clicks_amount@1", key, amount)]

    coord = _committed(dsn)
    try:
        [(broken,)] = query(dsn, "SELECT id FROM airflow_txn.quarantine WHERE record LIKE '%\"x\"%'")
        coord.edit_quarantined("clicks", broken, '{"user": "x", "amount": 3}')
        txn = coord.plan_replay("clicks", "replay", {"ids": [broken]})
        process_batch(coord, "clicks", txn.txid, strict)
        assert coord.commit("clicks", txn.txid).committed
        live = table(dsn, "clicks_amount")
        config = counting_topology(max_batch_size=12, max_quarantined=None).to_config()
        config["states"][1]["version"] = 2  # the transform changed, nothing else
        coord.register(TopologySpec.from_config(config))
        coord.recompute(StateBuild("clicks"), python_fold(coord, coord.spec("clicks"), doubled))
        assert table(dsn, "clicks_amount") == {user: 2 * v for user, v in live.items()} and live["x"] == 3
        assert table(dsn, "clicks_amount_v1") == live
    finally:
        coord.close()
