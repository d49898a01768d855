"""The alerting callbacks of the observability guide: a module importable where the workers and the
triggerer run (a DAGs folder is on their ``sys.path``). ``notify`` stands for your pager's client."""

from __future__ import annotations

import logging
from typing import Any

log = logging.getLogger("my_alerts")


def notify(message: str) -> None:
    """Page the on-call engineer: swap in your pager's or chat's client; here the message is logged."""
    log.warning("PAGE: %s", message)


# --8<-- [start:on-stall]
def page_on_call(*, topology_id: str, reason: str, stalled_seconds: float, context: Any) -> None:
    notify(f"{topology_id} stalled for {stalled_seconds / 60:.0f} min: {reason}")
# --8<-- [end:on-stall]


# --8<-- [start:on-late-commit]
async def page_late_commit(*, topology_id: str, context: dict[str, Any]) -> None:
    run = context["dag_run"]  # the run, as Airflow's REST API shows it
    notify(f"{topology_id}: {run['dag_run_id']} has not committed in 10 minutes")
# --8<-- [end:on-late-commit]
