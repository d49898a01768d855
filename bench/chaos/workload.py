"""The workload and its oracle: producers appending tweets (with duplicate deliveries and malformed
records) to the event log, and the ledger of what they appended, by event id. The payments
mode's producers (``payments.py``) keep the same ledger of requests."""

from __future__ import annotations

import json
import logging
import random
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from airflow_transactional import EventLog

from .config import LOG, ChaosConfig

DOMAINS = ("example.com", "apache.org", "postgresql.org", "spark.apache.org", "kleppmann.com")


def domain_of(url: str) -> str:
    host = (urlsplit(url).hostname or "").lower()
    return host[4:] if host.startswith("www.") else host


class Ledger:
    """What the producers appended, by event id: the oracle's only input.

    Every acknowledged append is also written to ``path`` (JSON lines, flushed), so the oracle of
    a run whose harness died can still be computed: ``python -m bench.chaos --check DIR``.
    """

    def __init__(self, path: Path | None = None) -> None:
        self.lock = threading.Lock()
        self.valid: dict[str, Any] = {}      # event id -> url (words) or the request (payments)
        self.malformed: set[str] = set()
        self.sent: list[tuple[str, str]] = []
        self.duplicates = 0
        self.deposits: dict[str, int] = {}   # payments: account -> what the bank deposited first
        self.appended_at: dict[str, float] = {}  # event id -> when its append was acknowledged (epoch s)
        self.aborted = 0                     # kafka: records sent in producer transactions that aborted
        self.deleted: dict[int, int] = {}    # kafka: partition -> offset below which records were deleted
        self.versions: dict[str, list[str]] = {}  # s3: a version (key@ETag) -> the ids of its records
        self.mutated: dict[str, str] = {}    # s3: a version the harness overwrote or deleted -> how
        self.replayed: dict[str, str] = {}   # words: a malformed record fixed and replayed -> its URL
        self._file = open(path, "a", encoding="utf-8") if path else None  # closed by close()

    def record(self, fresh: list[tuple[str, str, Any]], duplicates: int) -> None:
        """An append was acknowledged: ``fresh`` (id, payload, what it means -- None if
        malformed), and ``duplicates`` earlier events sent again. Call with ``lock`` held."""
        now = time.time()
        for eid, payload, value in fresh:
            self.sent.append((eid, payload))
            self.appended_at[eid] = now
            if value is None:
                self.malformed.add(eid)
            else:
                self.valid[eid] = value
        self.duplicates += duplicates
        if self._file is not None:
            lines = [json.dumps({"id": eid, "value": value}) for eid, _, value in fresh]
            lines += [json.dumps({"duplicate": True})] * duplicates
            self._file.write("".join(f"{line}\n" for line in lines))
            self._file.flush()

    def record_deposits(self, deposits: dict[str, int]) -> None:
        """The bank's deposits were acknowledged (payments mode)."""
        with self.lock:
            for account, amount in deposits.items():
                self.deposits[account] = self.deposits.get(account, 0) + amount
            if self._file is not None:
                self._file.write(json.dumps({"deposits": deposits}) + "\n")
                self._file.flush()

    def record_replay(self, event_id: str, url: str) -> None:
        """The operator fixed malformed record ``event_id`` into a tweet of ``url`` and replayed it
        (words mode): counted once from then on. Call with ``lock`` held."""
        self.replayed[event_id] = url
        self._write({"replayed": event_id, "url": url})

    def record_aborted(self, records: int) -> None:
        """A producer transaction of ``records`` aborted (kafka mode). Call with ``lock`` held."""
        self.aborted += records
        self._write({"aborted": records})

    def record_deleted(self, partition: int, before: int) -> None:
        """The records of ``partition`` below offset ``before`` were deleted (kafka mode). Call
        with ``lock`` held."""
        self.deleted[partition] = max(before, self.deleted.get(partition, 0))
        self._write({"deleted": [partition, before]})

    def record_version(self, version: str, ids: list[str]) -> None:
        """A version of a file was uploaded, holding the records ``ids`` (s3 mode; they are
        recorded too). Call with ``lock`` held."""
        self.versions[version] = ids
        self._write({"version": version, "ids": ids})

    def record_mutation(self, version: str, how: str) -> None:
        """The harness overwrote or deleted a version (s3 mode). Call with ``lock`` held."""
        self.mutated[version] = how
        self._write({"mutated": version, "how": how})

    @property
    def mutated_keys(self) -> set[str]:
        """The keys whose versions the harness overwrote or deleted."""
        return {v.rsplit("@", 1)[0] for v in self.mutated}

    def _write(self, entry: dict[str, Any]) -> None:
        if self._file is not None:
            self._file.write(json.dumps(entry) + "\n")
            self._file.flush()

    @classmethod
    def load(cls, path: Path) -> Ledger:
        ledger = cls()
        with open(path, encoding="utf-8") as fh:
            for line in fh:
                entry = json.loads(line)
                if entry.get("duplicate"):
                    ledger.duplicates += 1
                elif "aborted" in entry:
                    ledger.aborted += entry["aborted"]
                elif "deleted" in entry:
                    p, before = entry["deleted"]
                    ledger.deleted[p] = max(before, ledger.deleted.get(p, 0))
                elif "version" in entry:
                    ledger.versions[entry["version"]] = entry["ids"]
                elif "replayed" in entry:
                    ledger.replayed[entry["replayed"]] = entry["url"]
                elif "mutated" in entry:
                    ledger.mutated[entry["mutated"]] = entry["how"]
                elif "deposits" in entry:
                    for account, amount in entry["deposits"].items():
                        ledger.deposits[account] = ledger.deposits.get(account, 0) + amount
                elif entry["value"] is None:
                    ledger.malformed.add(entry["id"])
                else:
                    ledger.valid[entry["id"]] = entry["value"]
        return ledger

    def close(self) -> None:
        if self._file is not None:
            self._file.close()

    def url_counts(self) -> Counter[str]:
        return Counter([*self.valid.values(), *self.replayed.values()])

    def domain_counts(self) -> Counter[str]:
        return Counter(domain_of(u) for u in [*self.valid.values(), *self.replayed.values()])

    def restricted_to(self, ids: set[str]) -> Ledger:
        """The same ledger, with only the events in ``ids``."""
        part = Ledger()
        part.valid = {e: u for e, u in self.valid.items() if e in ids}
        part.malformed = self.malformed & ids
        part.replayed = {e: u for e, u in self.replayed.items() if e in ids}
        part.duplicates, part.deposits = self.duplicates, self.deposits
        part.aborted, part.deleted = self.aborted, self.deleted
        part.versions, part.mutated = self.versions, self.mutated
        return part


class Producer(threading.Thread):
    """Appends tweets until stopped; an append interrupted by a fault is retried with the same ids."""

    LOG = LOG
    ID_PREFIX = "p"
    #: What a malformed record looks like: broken JSON, a required field missing, not JSON.
    MALFORMED = ('{"url": truncated', '{"user": "u1"}', "not json at all")

    def __init__(self, dsn: str, index: int, cfg: ChaosConfig, ledger: Ledger, stop: threading.Event) -> None:
        super().__init__(name=f"producer-{index}", daemon=True)
        self.log = EventLog(dsn, self.LOG, retry_for=120)
        self.index, self.cfg, self.ledger, self.stop_event = index, cfg, ledger, stop
        self.rng = random.Random(cfg.seed * 1000 + index)
        self.n = 0
        self.error: BaseException | None = None

    def _event(self) -> tuple[str, str, Any]:
        """(event id, payload, what the ledger keeps -- None for a malformed record)."""
        self.n += 1
        eid = f"{self.ID_PREFIX}{self.index}-{self.n}"
        if self.rng.random() < self.cfg.malformed_rate:
            return eid, self.rng.choice(self.MALFORMED), None
        return self._record(eid)

    def _record(self, eid: str) -> tuple[str, str, Any]:
        """A well-formed event: a tweet."""
        prefix, host = self.rng.choice(["", "www.", "WWW."]), self.rng.choice(DOMAINS)
        url = f"https://{prefix}{host}/post/{self.rng.randint(1, 60)}"
        return eid, json.dumps({"url": url, "user": f"u{self.rng.randint(1, 99)}"}), url

    def run(self) -> None:
        try:
            while not self.stop_event.wait(0.5):
                fresh = [self._event() for _ in range(max(1, self.cfg.rate // 2))]
                batch = [(e, p) for e, p, _ in fresh]
                dup = 0
                with self.ledger.lock:
                    if self.ledger.sent and self.rng.random() < self.cfg.duplicate_rate * len(fresh):
                        batch.append(self.rng.choice(self.ledger.sent))  # the very same delivery again
                        dup = 1
                while True:
                    try:
                        self._append(batch)
                        break
                    except Exception as exc:  # the producer API already retried for two minutes
                        logging.warning("%s: append failed (%s); retrying the same event ids", self.name, exc)
                        time.sleep(1)
                with self.ledger.lock:
                    self.ledger.record(fresh, dup)
        except BaseException as exc:  # reported at the end
            self.error = exc
        finally:
            self.log.close()

    def _append(self, batch: list[tuple[str, str]]) -> None:
        self.log.append(batch)
