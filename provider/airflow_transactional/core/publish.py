"""Publishing committed output to Kafka, exactly once for read_committed consumers.

An output declared with ``kafka_topic`` is published after its commits: each committed txid's
events in one Kafka transaction, strictly in txid order, by one publisher per topology and output
(a fixed ``transactional.id``: a second one fences the first; here the output's turn,
:mod:`..store.turns`, keeps a second from starting at all). After the Kafka transaction commits, the txid is recorded in
``publications``. A publisher that died between the two finds the txid in the topic itself (its
records' headers, read at read_committed past the offsets last recorded), so nothing is published
twice and nothing skipped.

What is promised: each committed txid's events appear in the topic once, all together, in txid
order, to consumers that read committed records. What is not: publishing is after the Postgres
commit, with a lag (a failed publish is retried by the next run), not atomic with it; a consumer at
read_uncommitted may see an aborted attempt's records. (Kafka's part in an external two-phase
commit, KIP-939, is not released.)
"""

from __future__ import annotations

import logging
import time
from typing import NamedTuple

from .. import faults
from ..exceptions import ConfigError, TransactionalError
from ..sinks.kafka import KafkaPublisher, PublishedEvent, Scan
from ..sources.kafka import client_config
from ..spec import OutputSpec, TopologySpec
from ..store import outputs, publications, turns
from .context import StateStore

log = logging.getLogger(__name__)

#: How long a publisher waits for another one of the same output to finish.
LOCK_WAIT = 300.0


class Publication(NamedTuple):
    output: str
    topic: str
    published_through: int  # the last txid published (before: the first of this call's minus one)
    txids: list[int]  # published by this call
    ignored: int  # records in the topic that claimed to be this output's and were not believed


def publish(store: StateStore, topology_id: str, through_txid: int | None = None) -> list[Publication]:
    """Publish every committed txid up to ``through_txid`` (default: the last committed) not yet
    published, of every output of ``topology_id`` declared with a Kafka topic."""
    with store.db.transaction() as cur:
        num, spec, committed, _offsets = store.load(cur, topology_id)
    target = committed if through_txid is None else min(int(through_txid), committed)
    return [_publish_output(store, num, spec, out, target) for out in spec.outputs if out.kafka_topic]


def mark_published(store: StateStore, topology_id: str, output: str, txid: int) -> int:
    """Record ``output``'s txids through ``txid`` as published without publishing them (after an
    operator published them by other means); the txid recorded before. Never moves backwards."""
    with store.db.transaction() as cur:
        _num, spec, committed, _offsets = store.load(cur, topology_id)
        out = spec.output(output)
        if out.kafka_topic is None:
            raise ConfigError(f"output {output!r} of topology {topology_id!r} publishes to no Kafka topic")
        if not 0 < txid <= committed:
            raise ConfigError(f"topology {topology_id!r} has committed txids 1..{committed}: cannot mark txid {txid} "
                              "published")
        recorded = publications.get(cur, store.schema, topology_id, output)
        publications.record(cur, store.schema, topology_id, output, out.kafka_topic, txid, recorded.topic_offsets)
    log.warning("topology %s output %s: txids through %d marked published to %s by hand", topology_id, output, txid,
                out.kafka_topic)
    return recorded.published_txid


def _publish_output(store: StateStore, num: int, spec: TopologySpec, out: OutputSpec, target: int) -> Publication:
    topic = out.kafka_topic
    if topic is None:
        raise ConfigError(f"output {out.name!r} of topology {spec.topology_id!r} publishes to no Kafka topic")
    key = f"{store.schema}.{spec.topology_id}.{out.name}"
    turn = _take_turn(store, key)
    try:
        with store.db.transaction() as cur:
            recorded = publications.get(cur, store.schema, spec.topology_id, out.name)
        if recorded.published_txid >= target:
            return Publication(out.name, topic, recorded.published_txid, [], 0)
        publisher = KafkaPublisher(client_config(out.kafka_conn_id, store.connections), topic=topic,
                                   topology_id=spec.topology_id, output=out.name, transactional_id=f"airflow-txn.{key}",
                                   registration=num)
        offsets = dict(recorded.topic_offsets)
        scan = publisher.scan(offsets)
        done, ignored = _found_in_topic(store, spec, out, scan, recorded.published_txid, target)
        if done > recorded.published_txid:  # published before, not recorded: the publisher died between
            log.warning("topology %s output %s: txid %d was published to %s before this publisher started (found "
                        "in the topic); it is not published again", spec.topology_id, out.name, done, topic)
            placed = scan.retractions.get(done, [])
            identity = publisher.identity() if placed else ("", "")
            with store.db.transaction() as cur:
                publications.record(cur, store.schema, spec.topology_id, out.name, topic, done, offsets)
                publications.record_retractions(cur, store.schema, spec.topology_id, topic, identity, done, placed)
        published = []
        for txid in range(done + 1, target + 1):
            events = _events(store, spec.topology_id, out.name, txid)
            scope = (spec.topology_id, str(txid))
            placed = []
            if events:
                sent = publisher.publish(txid, events, before_commit=lambda scope=scope: faults.point(
                    "publish.before_kafka_commit", scope=scope))
                offsets.update(sent.offsets)
                placed = sent.retractions
                faults.point("publish.after_kafka_commit", scope=scope)
            identity = publisher.identity() if placed else ("", "")
            with store.db.transaction() as cur:
                publications.record(cur, store.schema, spec.topology_id, out.name, topic, txid, offsets)
                publications.record_retractions(cur, store.schema, spec.topology_id, topic, identity, txid, placed)
            published.append(txid)
        if published:
            log.info("topology %s output %s: published txids %d..%d to Kafka topic %s", spec.topology_id, out.name,
                     published[0], published[-1], topic)
        return Publication(out.name, topic, done, published, ignored)
    finally:
        turn.release()


def _found_in_topic(store: StateStore, spec: TopologySpec, out: OutputSpec, scan: Scan, recorded: int,
                    target: int) -> tuple[int, int]:
    """The last txid published (``recorded``, or the one after it when the topic holds exactly its
    events: a publisher that died between the Kafka commit and its record), and how many claims in
    the topic were not believed -- each logged. One publisher records every txid it publishes, so
    no other txid can be there unrecorded; and anyone who may write to the topic can write its
    headers, so a claim counts only when its records are exactly the txid's committed events."""
    done, doubts = recorded, list(scan.strangers)
    nxt = recorded + 1
    for txid, records in sorted(scan.claims.items()):
        if txid == nxt <= target and sorted(records) == sorted(
                (e.event_id, e.payload) for e in _events(store, spec.topology_id, out.name, nxt)):
            done = nxt
        else:
            doubts.append(f"{len(records)} records naming txid {txid}")
    if doubts:
        log.warning("topology %s output %s: %d claims in Kafka topic %s to be this output's were not believed -- "
                    "not its next txid, another registration's, or not its events (someone else writes to the "
                    "topic?): %s", spec.topology_id, out.name, len(doubts), out.kafka_topic, "; ".join(doubts[:5]))
    return done, len(doubts)


def _events(store: StateStore, topology_id: str, output: str, txid: int) -> list[PublishedEvent]:
    """What the commit of ``txid`` appended to ``output``: every event, or an error if retention
    (forced past this publisher) removed some before they were published."""
    with store.db.transaction() as cur:
        events = outputs.events_of_txid(cur, store.schema, topology_id, txid, output)
        appended = publications.appended_count(cur, store.schema, topology_id, txid, output)
    if len(events) < appended:
        raise TransactionalError(
            f"topology {topology_id!r} output {output!r}: txid {txid} appended {appended} events, "
            f"{appended - len(events)} of them removed from the log (retention forced past what was published) "
            f"before they were published to Kafka. Nothing of txid {txid} is published. Publish those events from a "
            f"backup yourself, then record the txid as published: "
            f"`airflow-txn publish {topology_id} --mark-published {txid}`")
    return [PublishedEvent(e.partition, e.event_id, e.payload, e.retracts) for e in events]


def _take_turn(store: StateStore, key: str) -> turns.Held:
    """The turn of one output's publisher, waiting for another to finish."""
    deadline = time.monotonic() + LOCK_WAIT
    while True:
        held = turns.hold(store.db.dsn, store.schema, f"publish:{key}")
        if held is not None:
            return held
        if time.monotonic() > deadline:
            raise TransactionalError(f"another publisher of {key} held its lock for {LOCK_WAIT:.0f} s: retry when it "
                                     "has finished")
        time.sleep(1.0)
