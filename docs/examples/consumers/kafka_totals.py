"""A consumer of a published output topic that keeps per-user totals and follows corrections
(docs/guides/corrections.md; run by tests/integration/test_kafka_publish.py)."""

from __future__ import annotations

# --8<-- [start:totals]
import json
from collections.abc import Iterable
from typing import Any

from airflow_transactional.sinks.kafka import RETRACTS  # "airflow-txn-retracts"


def totals(messages: Iterable[Any]) -> dict[str, int]:
    """Per user, the sum of the amounts of the topic's events (read_committed): a correction's
    retraction, which carries the RETRACTS header, takes its payload's amount back."""
    out: dict[str, int] = {}
    for msg in messages:
        sign = -1 if RETRACTS in dict(msg.headers() or []) else 1
        event = json.loads(msg.value())
        out[event["user"]] = out.get(event["user"], 0) + sign * event["amount"]
    return {user: amount for user, amount in out.items() if amount}
# --8<-- [end:totals]
