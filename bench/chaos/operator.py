"""What the operator of the words topology does besides clearing failed runs (``CORRECTION_KINDS``),
each a run triggered over the REST API with its conf, as from the UI's *Trigger DAG* form:

* ``correct``: a correction of one committed txid under the code it was committed with
  (``{"correct": "N..N"}``) -- it must commit, and change nothing;
* ``replay``: a malformed record of the quarantine fixed by hand (``airflow-txn quarantine --edit``)
  into a tweet of its own URL, and replayed (``{"replay": {"ids": [ID]}}``) -- the ledger then
  counts that URL once, and the record stays quarantined once (as replayed).

A correction of a txid whose record was replayed edited is refused by design (it would read the
source again and undo the edit), so the operator does not ask for one.
"""

from __future__ import annotations

import json
import logging
import random

from airflow_transactional.coordinator import Coordinator
from airflow_transactional.exceptions import ConfigError, UnknownTopology
from dev.localstack import LocalStack, RestClient

from .config import ChaosConfig
from .supervisor import rest
from .workload import Ledger

#: Where a replayed record's URL points: a domain no producer writes.
REPLAYED = "https://replayed.example/{}"


class Operator:
    def __init__(self, stack: LocalStack, cfg: ChaosConfig, client: RestClient, ledger: Ledger | None,
                 rng: random.Random) -> None:
        self.stack, self.cfg, self.client, self.ledger, self.rng = stack, cfg, client, ledger, rng
        self.replayed_txids: set[int] = set()  # txids whose records it replayed edited: not to be corrected
        self.taken: set[int] = set()           # quarantined records it replayed
        self.runs = 0

    def correct(self) -> bool:
        """Correct one committed txid that read records, under the code it was committed with (a
        txid it could not correct is no moment for it: a correction's own plan refuses, naming why)."""
        topology = self.cfg.topologies[0]
        with Coordinator(self.stack.state_dsn) as coord:
            if not _registered(coord, topology):
                return False
            done = [c["txid"] for c in coord.commits(topology)
                    if not c["corrects"] and c["records_read"] and c["txid"] not in self.replayed_txids]
            if not done:
                return False
            txid = self.rng.choice(done)
            try:
                coord.correction_batch(topology, txid, txid)
            except ConfigError as exc:
                logging.info("fault: no correction of txid %d: %s", txid, exc)
                return False
        return self._trigger(topology, f"correct-{txid}", {"correct": f"{txid}..{txid}"})

    def replay(self) -> bool:
        """Fix one malformed record of the quarantine by hand and replay it."""
        if self.ledger is None:
            return False
        topology = self.cfg.topologies[0]
        with self.ledger.lock:
            malformed = set(self.ledger.malformed)
        with Coordinator(self.stack.state_dsn) as coord:
            if not _registered(coord, topology):
                return False
            waiting = [r for r in coord.quarantined_records(topology) if r["replayed_by"] is None
                       and r["corrected_by"] is None and r["id"] not in self.taken and r["event_id"] in malformed]
            if not waiting:
                return False
            record = self.rng.choice(waiting)
            url = REPLAYED.format(record["event_id"])
            coord.edit_quarantined(topology, record["id"], json.dumps({"url": url, "user": "operator"}))
        self.taken.add(record["id"])
        self.replayed_txids.add(int(record["txid"]))
        with self.ledger.lock:
            self.ledger.record_replay(record["event_id"], url)
        return self._trigger(topology, f"replay-{record['id']}", {"replay": {"ids": [record["id"]]}})

    def _trigger(self, topology: str, what: str, conf: dict[str, object]) -> bool:
        self.runs += 1
        run_id = f"chaos-{self.cfg.seed}-{what}-{self.runs}"
        logging.info("fault: %s of %s (run %s)", what, topology, run_id)
        rest(self.client.trigger, topology, None, run_id, conf)  # its DAG's id
        return True


def _registered(coord: Coordinator, topology: str) -> bool:
    """Whether the topology's first plan task has registered it (a fault struck early finds nothing
    to correct or replay yet: its moment has not come)."""
    try:
        coord.spec(topology)
    except UnknownTopology:
        return False
    return True
