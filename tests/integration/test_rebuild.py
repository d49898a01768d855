"""core/rebuild.py: each rebuild has an id and a liveness lock; an aborted one can never swap,
a live one is not aborted by accident."""

from __future__ import annotations

import pytest

from airflow_transactional.coordinator import Coordinator
from tests.helpers import click, counting_topology, make_log, run_one

pytestmark = pytest.mark.integration


def test_an_aborted_rebuild_can_never_swap_and_a_live_one_is_not_aborted_by_accident(dsn: str) -> None:
    from airflow_transactional import rebuild

    make_log(dsn).append([click(i) for i in range(30)])
    owner, operator = Coordinator(dsn), Coordinator(dsn)
    try:
        owner.register(counting_topology())
        run_one(owner, "clicks", "r1")
        mine = rebuild.begin(owner, "clicks")
        with pytest.raises(rebuild.RebuildInProgress, match=r"still running.*--force"):
            rebuild.abort(operator, "clicks")
        with pytest.raises(rebuild.RebuildInProgress, match="has a rebuild running"):
            rebuild.begin(operator, "clicks")
        assert rebuild.abort(operator, "clicks", force=True)
        with pytest.raises(Exception, match=f"rebuild {mine.rebuild_id} .* was aborted or replaced"):
            rebuild.swap(owner, mine)
        assert not rebuild.abort(owner, "clicks", rebuild=mine)  # its own clean-up touches nothing else
        theirs = rebuild.begin(operator, "clicks")  # the lock is free again
        assert theirs.rebuild_id != mine.rebuild_id
        operator.close()  # its process died: the lock goes with the session
        assert rebuild.abort(owner, "clicks")  # no --force needed for a dead rebuild
    finally:
        owner.close()
        operator.close()
