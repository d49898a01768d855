"""The test stack's ``on_stall`` for the stall watch (dags/stall_watch.py): each call, one JSON line
in the file the test reads (test_stall_watch.py)."""

from __future__ import annotations

import json
import os
from typing import Any


def record(*, topology_id: str, reason: str, stalled_seconds: float, context: Any) -> None:
    with open(os.environ["AIRFLOW_TXN_STALL_ALERTS_FILE"], "a") as out:
        out.write(json.dumps({"topology_id": topology_id, "reason": reason, "stalled_seconds": stalled_seconds,
                              "run_id": context["run_id"]}) + "\n")
