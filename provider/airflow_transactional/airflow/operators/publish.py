"""The publish task of a topology whose outputs go to Kafka: after the run's commit, every
committed txid through the run's own that is not published yet, each in one Kafka transaction
(``core/publish.py``). A failed publish is retried by Airflow, or caught up by the next run."""

from __future__ import annotations

from typing import Any

from .base import TopologyTask


class PublishOperator(TopologyTask):
    """Publish the committed output of this run's txid (and any earlier one not yet published)."""

    ui_color = "#e8f5e9"

    def execute(self, context: Any) -> dict[str, Any]:
        with self.coordinator() as coordinator:
            txn = self.run_transaction(coordinator, context)
            done = coordinator.publish(self.topology_id, through_txid=txn.txid)
        for p in done:
            self.log.info("output %s: %s to Kafka topic %s (published through txid %d before this task)", p.output,
                          f"published txids {p.txids[0]}..{p.txids[-1]}" if p.txids else "nothing new to publish",
                          p.topic, p.published_through)
            if p.ignored:
                self.log.warning("output %s: %d records in Kafka topic %s claimed to be its own and were not believed "
                                 "(someone else writes to the topic?)", p.output, p.ignored, p.topic)
        return {"txid": txn.txid, "published": {p.output: p.txids for p in done}}
