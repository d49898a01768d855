"""The s3 mode: the words topology reading files landed in an S3 bucket (``bench/dags/chaos_s3.py``,
opaque) while the store itself is struck.

Producers upload JSON-lines files of tweets to ``s3a://chaos-landing/tweets`` (some lines
malformed, each carrying a token of its own) and now and then upload one of their files again with
the very same bytes (a duplicate delivery: the same ETag, the same version, never counted twice).
The ledger keeps every version uploaded, by key and ETag, with the records it holds. The store's
faults:

  s3_kill_processing   the S3 server SIGKILLed while a batch is processed, started again on its
                       port and data a few seconds later
  object_overwrite     a file of a planned, uncommitted txid uploaded again with other records:
                       a new version, planned later; the planned one is gone
  object_delete        a file of a planned, uncommitted txid deleted
  slow_get             for 20-40 s every GET of an object held 1-4 s and its answer trickled
                       (a :class:`~dev.slowlink.SlowLink` in front of the server); listings and
                       uploads pass

An upload and a kill never overlap (``gate``): the producers are the oracle, whose outcome must
be known. The checks: the state equals the ledger's versions less those the topology reported
lost (the ``lost`` paths of its committed txids, each the version registered in that txid's range),
every lost version one the harness overwrote or deleted; the quarantine holds each malformed
line of the counted versions once (found by its token); the audit log holds txids 1..N in order.
"""

from __future__ import annotations

import json
import logging
import os
import random
import re
import threading
import time
from typing import Any

import psycopg2

from dev.localstack import LocalStack, RestClient
from dev.s3 import S3Server

from .config import MODES, ChaosConfig, ChaosReport
from .supervisor import rest
from .workload import DOMAINS, Ledger

TOPOLOGY = MODES["s3"][0]
BUCKET, PREFIX = "chaos-landing", "tweets"
LANDING = f"s3a://{BUCKET}/{PREFIX}"
#: A malformed line's token: what finds it in the quarantine, whatever the reader kept of the line.
TOKEN = re.compile(r"m-\d+-\d+-\d+")


def version_id(key: str, etag: str) -> str:
    """How the ledger names a version: its key and its ETag (without quotes)."""
    return f"{key}@{etag.strip(chr(34))}"


def tweet_file(rng: random.Random, lines: int, malformed_rate: float, name: str) -> tuple[bytes, list[Any]]:
    """A file of ``lines`` tweets, some malformed: (its bytes, (line number, url or a malformed
    line's token) for each line; a token is ``m-...``)."""
    text, meaning = [], []
    for i in range(lines):
        if rng.random() < malformed_rate:
            token = f"m-{name}-{i}"
            text.append(rng.choice([f'{{"url": truncated {token}', json.dumps({"user": token}),
                                    f"not json at all {token}"]))
            meaning.append((i, token))
            continue
        prefix, host = rng.choice(["", "www.", "WWW."]), rng.choice(DOMAINS)
        url = f"https://{prefix}{host}/post/{rng.randint(1, 60)}"
        text.append(json.dumps({"url": url, "user": f"u{rng.randint(1, 99)}"}))
        meaning.append((i, url))
    return ("\n".join(text) + "\n").encode(), meaning


def record_version(ledger: Ledger, key: str, etag: str, meaning: list[Any]) -> None:
    """A version was uploaded: its records into the ledger (a malformed line by its token). Call
    with ``ledger.lock`` held."""
    vid = version_id(key, etag)
    fresh = [(m if m.startswith("m-") else f"{vid}:{i}", "", None if m.startswith("m-") else m) for i, m in meaning]
    ledger.record(fresh, 0)
    ledger.record_version(vid, [eid for eid, _, _ in fresh])


def setup(stack: LocalStack, client: RestClient) -> None:
    """The bucket, and the topology unpaused (its first, scheduled run plans an empty batch). The
    harness's own look at the topology's lag reads ``aws_default`` as Airflow's tasks do: from the
    environment, set here unless the caller did."""
    s3 = server_of(stack)
    os.environ.setdefault("AIRFLOW_CONN_AWS_DEFAULT", s3.airflow_connection())
    s3.create_bucket(BUCKET)
    rest(client.wait_for_dag, TOPOLOGY)
    rest(client.unpause, TOPOLOGY)


def server_of(stack: LocalStack) -> S3Server:
    if stack.s3 is None or stack.s3.link is None:
        raise RuntimeError("--mode s3 needs a stack with an S3 server behind a slow link "
                           "(LocalStack(s3=S3Server(..., link=True)))")
    return stack.s3


class Uploads(threading.Thread):
    """Uploads a file of tweets every second until stopped, now and then one of its earlier files
    again, unchanged. Holds ``gate`` for each upload."""

    def __init__(self, s3: S3Server, index: int, cfg: ChaosConfig, ledger: Ledger, stop: threading.Event,
                 gate: threading.Lock) -> None:
        super().__init__(name=f"s3-producer-{index}", daemon=True)
        self.s3, self.index, self.cfg, self.ledger, self.stop_event, self.gate = s3, index, cfg, ledger, stop, gate
        self.rng = random.Random(cfg.seed * 1000 + index)
        self.sent: dict[str, bytes] = {}
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            client = self.s3.client()
            n = 0
            while not self.stop_event.wait(1.0):
                n += 1
                key = f"{PREFIX}/p{self.index}-{n:06d}.json"
                body, meaning = tweet_file(self.rng, max(1, self.cfg.rate), self.cfg.malformed_rate * 5,
                                           f"{self.index}-{n}")
                etag = self._put(client, key, body)
                with self.ledger.lock:
                    record_version(self.ledger, key, etag, meaning)
                self.sent[key] = body
                if self.rng.random() < self.cfg.duplicate_rate * 5:
                    self._again(client)
        except BaseException as exc:  # reported at the end
            self.error = exc

    def _again(self, client: Any) -> None:
        """One of this producer's files uploaded again, byte for byte -- unless the harness has
        overwritten or deleted it (then those bytes would be an older version coming back)."""
        with self.ledger.lock:
            keys = [k for k in self.sent if k not in self.ledger.mutated_keys]
            if not keys:
                return
            key = self.rng.choice(keys)
            self._put(client, key, self.sent[key])
            self.ledger.record([], 1)

    def _put(self, client: Any, key: str, body: bytes) -> str:
        """Upload ``body`` to ``key`` until the server took it; its ETag."""
        while True:
            try:
                with self.gate:
                    return str(client.put_object(Bucket=BUCKET, Key=key, Body=body)["ETag"])
            except Exception as exc:  # the server being restarted; the same bytes again
                logging.warning("%s: upload of %s failed (%s); again", self.name, key, exc)
                time.sleep(1)


class StoreFaults:
    """The s3 kinds of :class:`.faults.Faults`."""

    def __init__(self, s3: S3Server, dsn: str, components: threading.Lock, ledger: Ledger, gate: threading.Lock,
                 rng: random.Random) -> None:
        # ``components``: the supervisor's lock, held while a fault restarts a component
        self.s3, self.dsn, self.components, self.ledger, self.gate, self.rng = s3, dsn, components, ledger, gate, rng
        self.client = s3.client()

    def kill_and_restart(self) -> None:
        """SIGKILL the S3 server, wait a moment, start it again (same port, same data)."""
        with self.gate, self.components:
            self.s3.kill()
            logging.info("fault: the S3 server SIGKILLed")
            time.sleep(self.rng.uniform(1, 5))
            self.s3.start()

    def slow(self) -> None:
        assert self.s3.link is not None
        seconds = self.rng.uniform(20, 40)
        self.s3.link.slow(seconds, (1.0, 4.0))
        logging.info("fault: slow_get: object GETs held 1-4 s each for %.0f s", seconds)

    def mutate(self, how: str, timeout: float = 180) -> bool:
        """Overwrite (``how`` = "overwrite") or delete a file of a planned, uncommitted txid, as
        planned; False if no such file came in ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for key, etag in self._planned():
                with self.ledger.lock:
                    if version_id(key, etag) in self.ledger.mutated or not self._holds(key, etag):
                        continue
                    if how == "overwrite":
                        body, meaning = tweet_file(self.rng, 6, 0.05, f"9-{self.rng.randrange(10**6)}")
                        record_version(self.ledger, key, self.client.put_object(
                            Bucket=BUCKET, Key=key, Body=body)["ETag"], meaning)
                    else:
                        self.client.delete_object(Bucket=BUCKET, Key=key)
                    self.ledger.record_mutation(version_id(key, etag), how)
                logging.info("fault: object_%s: %s (ETag %s) of a planned txid", how, key, etag)
                return True
            time.sleep(1)
        return False

    def _holds(self, key: str, etag: str) -> bool:
        try:
            return str(self.client.head_object(Bucket=BUCKET, Key=key)["ETag"]).strip('"') == etag.strip('"')
        except Exception:  # gone already, or the server restarting: not this one
            return False

    def _planned(self) -> list[tuple[str, str]]:
        """(key, ETag) of the files of planned, uncommitted txids, shuffled."""
        try:
            with psycopg2.connect(self.dsn) as conn, conn.cursor() as cur:
                cur.execute("SELECT batch FROM airflow_txn.transactions WHERE topology_id = %s AND status = 'planned'",
                            (TOPOLOGY,))
                files = [f for (b,) in cur.fetchall() for f in (b or {}).get("files", [])]
            conn.close()
        except psycopg2.Error:  # no plan yet; Postgres restarting
            return []
        found = [(f["path"].removeprefix(f"s3a://{BUCKET}/"), str(f.get("version") or "")) for f in files]
        self.rng.shuffle(found)
        return [(k, e) for k, e in found if e]


def lost_versions(dsn: str) -> list[tuple[int, str]]:
    """(txid, version) of every version a committed txid reported lost (by its sequence number,
    within the txid's range)."""
    with psycopg2.connect(dsn) as conn, conn.cursor() as cur:
        cur.execute("SELECT t.txid, f.path, f.version FROM airflow_txn.transactions t "
                    "JOIN airflow_txn.landing_files f ON f.topology_id = t.topology_id "
                    " AND f.seq > (t.start_offsets->>'seq')::bigint AND f.seq <= (t.end_offsets->>'seq')::bigint "
                    " AND t.batch->'lost'->'ranges' @> to_jsonb(f.seq) "
                    "WHERE t.topology_id = %s AND t.status = 'committed'", (TOPOLOGY,))
        rows = cur.fetchall()
    conn.close()
    return [(int(txid), version_id(path.removeprefix(f"s3a://{BUCKET}/"), str(v or ""))) for txid, path, v in rows]


def registered_through(dsn: str) -> set[str]:
    """The versions at or below the committed checkpoint (a post-mortem checks only those)."""
    with psycopg2.connect(dsn) as conn, conn.cursor() as cur:
        cur.execute("SELECT f.path, f.version FROM airflow_txn.landing_files f JOIN airflow_txn.topologies t "
                    "USING (topology_id) WHERE topology_id = %s "
                    "AND f.seq <= coalesce((t.committed_offsets->>'seq')::bigint, 0)", (TOPOLOGY,))
        rows = cur.fetchall()
    conn.close()
    return {version_id(p.removeprefix(f"s3a://{BUCKET}/"), str(v or "")) for p, v in rows}


def expected(dsn: str, report: ChaosReport, ledger: Ledger) -> Ledger:
    """The ledger's records the state must hold: every version's, less the versions the topology
    reported lost (each checked against what the harness overwrote or deleted); in a post-mortem,
    only the versions at or below the committed checkpoint."""
    r = report
    r.malformed_injected, r.duplicate_deliveries = len(ledger.malformed), ledger.duplicates
    r.events_appended = len(ledger.valid) + len(ledger.malformed)
    r.versions_uploaded = len(ledger.versions)
    lost = lost_versions(dsn)
    for txid, vid in lost:
        if vid not in ledger.mutated:
            r.problems.append(f"txid {txid} reported {vid} lost, which the harness never overwrote or deleted")
    gone = {vid for _, vid in lost}
    r.versions_lost = len(gone)
    kept = {vid for vid in ledger.versions if vid not in gone}
    if r.post_mortem:
        due = registered_through(dsn)
        r.events_pending = sum(len(ledger.versions[v]) for v in kept - due)
        kept &= due
    ids = {eid for vid in kept for eid in ledger.versions[vid]}
    r.skipped_records = sum(len(ledger.versions[v]) for v in gone if v in ledger.versions)
    return ledger.restricted_to(ids)


#: How ``airflow-txn audit`` refuses a landing whose committed files changed since: the paths.
CHANGED = re.compile(r"landing files gone or changed since they committed: ([^\n]*)")


def audit_refused(output: str, ledger: Ledger) -> str:
    """Why the audit refused, when it refused only for committed files the harness overwrote or
    deleted (their committed bytes are gone from the store); else ""."""
    found = CHANGED.search(output)
    paths = [p.strip().removeprefix(f"s3a://{BUCKET}/") for p in found.group(1).split(",")] if found else []
    if not paths or any(p not in ledger.mutated_keys for p in paths):
        return ""
    return (f"committed files the harness overwrote or deleted are gone from the bucket ({', '.join(paths[:3])}"
            f"{', ...' if len(paths) > 3 else ''})")
