"""What a chaos run is asked to do (:class:`ChaosConfig`), what it found (:class:`ChaosReport`),
and how its topologies are deployed: ``bench/dags/chaos_words.py`` (mode ``words``),
``bench/dags/chaos_kafka.py`` (mode ``kafka``), ``bench/dags/chaos_s3.py`` (mode ``s3``), or the
payments example itself, both stages (``dags/payments.py``, mode ``payments``)."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field, replace
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DAG_FILE = REPO / "bench" / "dags" / "chaos_words.py"
TOPOLOGY = DAG_FILE.stem
LOG = "chaos_tweets"
PAYMENTS_DAG_FILE = REPO / "dags" / "payments.py"
PAYMENTS_CONNECT_DAG_FILE = REPO / "bench" / "dags" / "chaos_payments.py"  # the example on Spark Connect
KAFKA_DAG_FILE = REPO / "bench" / "dags" / "chaos_kafka.py"
KAFKA_TOPIC = "chaos-tweets"
S3_DAG_FILE = REPO / "bench" / "dags" / "chaos_s3.py"
# The topologies of each mode; the harness triggers the first, the others follow its commits.
MODES = {"words": (TOPOLOGY,), "payments": ("payments", "settlement"), "kafka": (KAFKA_DAG_FILE.stem,),
         "s3": (S3_DAG_FILE.stem,)}
KINDS = ("spark_kill", "commit_kill_before", "commit_kill_after", "pg_restart_processing",
         "pg_restart_commit", "scheduler_restart", "api_restart", "clear")
# What only a Kafka-fed topology meets: the broker SIGKILLed (and restarted) while a batch is processed
# or a commit is open, records deleted under a plan, a partition added to the topic.
KAFKA_KINDS = ("kafka_kill_processing", "kafka_kill_commit", "delete_records", "add_partition")
# What only a cluster has (``--stack cluster``: Celery workers on Redis, a Spark standalone cluster):
# the Celery worker running a batch (its Spark driver with it) or a commit (inside its Postgres
# transaction) lost with its host, a Spark worker running an executor lost, the Spark master
# restarted under a batch (it recovers: its recovery directory), Redis restarted.
# What only a topology landing on S3 meets (``objects.py``): the S3 server SIGKILLed (and restarted)
# while a batch is processed, a planned file overwritten or deleted before its txid committed,
# object reads slowed down for a while.
OBJECT_KINDS = ("s3_kill_processing", "object_overwrite", "object_delete", "slow_get")
CLUSTER_KINDS = ("celery_kill_processing", "celery_kill_commit", "spark_worker_kill", "spark_master_restart",
                 "redis_restart")
STACKS = ("local", "cluster")
# How batches run: a spark-submit driver each, or as clients of a long-lived Spark Connect server
# (on the cluster stack, an application of the cluster), which can be lost under a batch.
BACKENDS = ("spark-submit", "connect")
CONNECT_KINDS = ("spark_connect_kill",)
# What the operator of the words topology does besides (bench/chaos/operator.py): a correction of one
# committed txid under the code it was committed with, which must change nothing; a malformed record
# of the quarantine fixed by hand and replayed, which the ledger then counts once.
CORRECTION_KINDS = ("correct", "replay")
# Faults of one lane strike one at a time; the lanes run side by side.
LANES = {"spark": ("spark_kill", "pg_restart_processing", "celery_kill_processing", "spark_worker_kill",
                   "spark_connect_kill"),
         "commit": ("commit_kill_before", "commit_kill_after", "pg_restart_commit", "celery_kill_commit"),
         "control": ("scheduler_restart", "api_restart", "clear", "spark_master_restart", "redis_restart", "correct",
                     "replay"),
         "kafka": KAFKA_KINDS, "store": OBJECT_KINDS}
TASKS = ("plan", "process", "commit")
LEDGER = "ledger.jsonl"  # under the run's directory: what the producers appended
DEPOSITS = "deposits.json"  # payments: what the bank deposited before the requests


@dataclass
class ChaosConfig:
    seed: int = 1
    mode: str = "words"            # which pipeline runs under the faults: a key of MODES
    transactions: int = 200
    faults: int = 400              # balanced: 50 of each of the eight kinds (kafka: 33 of twelve)
    kinds: tuple[str, ...] = ()    # default: every kind the mode has (KINDS, and KAFKA_KINDS for kafka)
    producers: int = 3
    rate: int = 8                  # events per second per producer (well below what commits absorb)
    duplicate_rate: float = 0.02   # chance an append also re-sends an earlier event id
    malformed_rate: float = 0.004  # chance an event is malformed
    max_in_flight: int = 3
    batch: int = 2000              # a backlog after a stall is caught up in a few transactions
    audit: bool = True             # also run `airflow-txn audit` (one more Spark pass)
    verify: bool = True            # words: each run ends with a verify task (the shadow audit), checked at the end
    drain_timeout: float = 900     # the drain reports runs stuck after this long with nothing moving
    aborted_rate: float = 0.1      # kafka: chance a producer transaction is aborted (never to be counted)
    stack: str = "local"           # local: LocalExecutor and local[N]; cluster: Celery and a Spark cluster
    backend: str = "spark-submit"  # connect: batches run on a Spark Connect server

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"unknown chaos mode {self.mode!r}: one of {', '.join(sorted(MODES))}")
        if self.stack not in STACKS:
            raise ValueError(f"unknown stack {self.stack!r}: one of {', '.join(STACKS)}")
        if self.backend not in BACKENDS:
            raise ValueError(f"backend {self.backend!r}: one of {', '.join(BACKENDS)}")
        self.kinds = self.kinds or self.known_kinds
        if unknown := set(self.kinds) - set(self.known_kinds):
            raise ValueError(f"fault kinds {sorted(unknown)} need what this run lacks: the Kafka kinds strike "
                             "a broker (--mode kafka), the cluster kinds a cluster (--stack cluster)")

    @property
    def known_kinds(self) -> tuple[str, ...]:
        """Every fault kind this run can strike: its mode's, its stack's and its backend's."""
        return (KINDS + (KAFKA_KINDS if self.mode == "kafka" else ())
                + (CORRECTION_KINDS if self.mode == "words" and self.stack == "local" else ())
                + (OBJECT_KINDS if self.mode == "s3" else ())
                + (CLUSTER_KINDS if self.stack == "cluster" else ())
                + (CONNECT_KINDS if self.backend == "connect" else ()))

    @classmethod
    def quick(cls, seed: int = 1, mode: str = "words", stack: str = "local",
              backend: str = "spark-submit") -> ChaosConfig:
        """The quick size (``--quick``, :meth:`sized`: what ``make test`` ran before the mixes left it);
        on Spark Connect one fault more: the server lost under a batch."""
        cfg = cls.sized(seed, mode, stack)
        if backend == "connect":
            cfg = replace(cfg, backend=backend, kinds=(*cfg.kinds, *CONNECT_KINDS), faults=cfg.faults + 1)
        return cfg

    @classmethod
    def sized(cls, seed: int, mode: str, stack: str) -> ChaosConfig:
        """The quick sizes: for ``words`` 6 transactions and 7 faults (each kind once: a Spark kill, two
        commit kills, an API server restart, a clear, a correction and a replay); for ``payments`` 3
        transactions of stage 1 (each followed by stage 2: twice the Spark work per transaction) and
        3 faults (a Spark kill, a commit kill, a clear), striking either stage; for ``kafka`` 6
        transactions and 6 faults: the four Kafka kinds, a Spark kill and a clear; for ``s3`` the
        same with the store's four kinds; on a cluster
        8 transactions and 6 faults: each cluster kind once, and a clear.

        Without the final ``airflow-txn audit`` (a Spark pass over every event, a minute here):
        the oracle is the independent check, and the audit has tests of its own."""
        kinds = ("spark_kill", "commit_kill_before", "commit_kill_after", "api_restart", "clear", "correct", "replay")
        if stack == "cluster":  # each cluster kind once, and a clear
            return cls(seed=seed, mode=mode, stack=stack, transactions=8, faults=6, producers=2, rate=6,
                       drain_timeout=600, audit=False, kinds=(*CLUSTER_KINDS, "clear"))
        if mode == "payments":
            return cls(seed=seed, mode=mode, transactions=3, faults=3, producers=2, rate=6, drain_timeout=420,
                       audit=False, kinds=("spark_kill", "commit_kill_after", "clear"))
        if mode == "kafka":
            return cls(seed=seed, mode=mode, transactions=6, faults=6, producers=2, rate=6, drain_timeout=420,
                       audit=False, kinds=("spark_kill", "clear", *KAFKA_KINDS))
        if mode == "s3":
            return cls(seed=seed, mode=mode, transactions=6, faults=6, producers=2, rate=6, drain_timeout=420,
                       audit=False, kinds=("spark_kill", "clear", *OBJECT_KINDS))
        return cls(seed=seed, mode=mode, transactions=6, faults=len(kinds), producers=2, rate=6, drain_timeout=420,
                   audit=False, kinds=kinds, malformed_rate=0.02)  # records to replay early in a short run

    @property
    def topologies(self) -> tuple[str, ...]:
        """The topologies under test; the first is the one the harness triggers."""
        return MODES[self.mode]


@dataclass
class ChaosReport:
    seed: int
    mode: str = "words"
    stack: str = "local"
    backend: str = "spark-submit"
    transactions_triggered: int = 0
    transactions_committed: int = 0  # of the topology the harness triggers
    commits_downstream: dict[str, int] = field(default_factory=dict)  # payments: settlement's commits
    decided: dict[str, int] = field(default_factory=dict)  # payments: granted, declined, quarantined, money
    faults: dict[str, int] = field(default_factory=dict)
    faults_missed: dict[str, int] = field(default_factory=dict)
    spark_kill_targets: dict[str, int] = field(default_factory=dict)
    component_restarts: int = 0
    operator_clears: int = 0
    events_appended: int = 0
    duplicate_deliveries: int = 0
    malformed_injected: int = 0
    slow_gets: int = 0          # s3: object GETs the slow link held
    aborted_records: int = 0    # kafka: records of producer transactions that aborted (never to be counted)
    skipped_records: int = 0    # kafka: committed records deleted before the topology read them (reported lost);
    #                             s3: the records of the versions it reported lost
    versions_uploaded: int = 0  # s3: file versions the producers and the harness uploaded
    versions_lost: int = 0      # s3: versions overwritten or deleted before they were read (reported lost)
    published_records: int = 0  # kafka: records a read_committed consumer reads of the published topic
    publish_lost: int = 0       # kafka: committed by the topology, never published
    publish_duplicated: int = 0  # kafka: published more than once, or never committed
    events_lost: int = 0
    events_duplicated: int = 0
    domain_mismatches: int = 0
    order_violations: int = 0
    quarantine_mismatches: int = 0
    corrections: int = 0        # words: corrections committed (of one txid, under its own code)
    corrections_changed: int = 0  # words: keys those corrections changed (a deterministic job changes none)
    replays: int = 0            # words: replays of fixed quarantined records committed
    stuck_runs: int = 0
    audit_clean: bool | None = None
    audit_refused: str = ""      # kafka: why the audit could not recompute (records the harness deleted)
    verified_through: int | None = None  # words: the shadow audit's mark at the end (None: not on)
    verification: dict[str, int] = field(default_factory=dict)  # words: committed txids by check status
    wall_seconds: float = 0.0
    problems: list[str] = field(default_factory=list)
    post_mortem: bool = False  # from --check: the state against the ledger, nothing about the run itself
    events_pending: int = 0     # --check: appended, but beyond the committed checkpoint (not yet due)
    invariant_failures: list[str] = field(default_factory=list)  # payments: what dev.payments.check refused

    @property
    def violations(self) -> int:
        return (self.events_lost + self.events_duplicated + self.domain_mismatches + self.order_violations
                + self.publish_lost + self.publish_duplicated + self.quarantine_mismatches + self.stuck_runs
                + (self.audit_clean is False) + len(self.problems)  # a correction that changed keys: a problem
                + sum(n for status, n in self.verification.items() if status != "verified")
                + len(self.invariant_failures))

    def table(self) -> str:
        """The report as the run prints it: a table of checks, then any problem found."""
        rows = self.rows()
        width = max(len(k) for k, _ in rows)
        lines = [f"| {'check':<{width}} | result |", f"|{'-' * (width + 2)}|--------|"]
        lines += [f"| {k:<{width}} | {v} |" for k, v in rows]
        lines += [f"- {p}" for p in self.invariant_failures + self.problems]
        return "\n".join(lines)

    def rows(self) -> list[tuple[str, object]]:
        """(check, result) of every line of the table, in order (what the docs' chaos page renders)."""
        audit = ("airflow-txn audit", f"refused, as it must: {self.audit_refused}" if self.audit_refused
                 else {None: "not run", True: "clean", False: "DIFFERENCES"}[self.audit_clean])
        if self.post_mortem:
            return [("transactions committed", self.transactions_committed),
                    ("duplicate deliveries / malformed records injected",
                     f"{self.duplicate_deliveries} / {self.malformed_injected}"),
                    *self._outcome(),
                    ("events not yet committed (beyond the checkpoint)", self.events_pending),
                    audit]
        rows: list[tuple[str, object]] = [("seed", self.seed),
                                          *([("stack", "CeleryExecutor (Redis, two workers), a Spark standalone "
                                                       "cluster")] if self.stack == "cluster" else []),
                                          *([("batches on", "a Spark Connect server")]
                                            if self.backend == "connect" else []),
                                          ("transactions committed", self.transactions_committed),
                                          ("transactions triggered", self.transactions_triggered)]
        rows += [(f"fault: {k}", v) for k, v in sorted(self.faults.items())]
        rows += [(f"fault: {k} (moment never came)", v) for k, v in sorted(self.faults_missed.items())]
        rows += [(f"spark_kill of a {k}", v) for k, v in sorted(self.spark_kill_targets.items())]
        if self.mode == "kafka":
            rows += [("fault: records in aborted producer transactions", self.aborted_records)]
        if self.mode == "s3":
            rows += [("slow object GETs (held, their answers trickled)", self.slow_gets)]
        rows += [("fault: duplicate_delivery", self.duplicate_deliveries),
                 ("fault: malformed_record", self.malformed_injected),
                 ("faults total", sum(self.faults.values()) + self.duplicate_deliveries + self.malformed_injected
                  + self.aborted_records + self.slow_gets),
                 ("component restarts (supervisor)", self.component_restarts),
                 ("failed runs cleared (operator)", self.operator_clears),
                 *self._outcome(),
                 ("stuck runs", self.stuck_runs),
                 audit,
                 ("wall time", f"{self.wall_seconds:.0f} s")]
        return rows

    def _outcome(self) -> list[tuple[str, object]]:
        """What the checks against the ledger found (known after the fact too)."""
        if self.mode == "payments":
            d = self.decided
            return [("requests appended (unique)", self.events_appended),
                    ("granted / declined / quarantined",
                     f"{d.get('granted', '?')} / {d.get('declined', '?')} / {d.get('quarantined', '?')}"),
                    *[(f"transactions committed by {t}", n) for t, n in sorted(self.commits_downstream.items())],
                    ("invariants of dev/payments.py", "VIOLATED" if self.invariant_failures else "all held"),
                    ("order violations", self.order_violations)]
        kafka = [("records deleted before they were read (skipped, reported lost)", self.skipped_records),
                 ("records published (read_committed) / not published / published twice or uncommitted",
                  f"{self.published_records} / {self.publish_lost} / {self.publish_duplicated}")]
        s3 = [("file versions uploaded", self.versions_uploaded),
              ("versions overwritten or deleted before they were read (reported lost) / their records",
               f"{self.versions_lost} / {self.skipped_records}")]
        return [("events appended (unique)", self.events_appended),
                *(kafka if self.mode == "kafka" else []), *(s3 if self.mode == "s3" else []),
                ("events lost", self.events_lost),
                ("events duplicated", self.events_duplicated),
                ("domain counts wrong", self.domain_mismatches),
                ("order violations", self.order_violations),
                ("quarantine mismatches", self.quarantine_mismatches),
                *([("corrections committed / keys they changed", f"{self.corrections} / {self.corrections_changed}"),
                   ("replays of fixed records committed", self.replays)] if self.mode == "words" else []),
                *([("shadow audit: verified through txid", self.verified_through),
                   ("shadow audit: committed txids by check",
                    ", ".join(f"{s} {n}" for s, n in sorted(self.verification.items())) or "none")]
                  if self.verified_through is not None else [])]


def write_dag(dags_dir: Path, cfg: ChaosConfig) -> None:
    """Deploy the run's topologies into ``dags_dir``: a symlink to their DAG file (and for
    ``words``, ``kafka`` and ``s3`` the run's parameters beside it; the payments example reads
    :func:`dag_env`, and on Spark Connect is deployed as ``bench/dags/chaos_payments.py``)."""
    target = dag_file(cfg)
    if cfg.mode == "payments":
        link = dags_dir / target.name
        if not link.is_symlink():
            os.symlink(target, link)
        return
    link = dags_dir / target.name
    if not link.is_symlink():
        os.symlink(target, link)
    link.with_suffix(".json").write_text(json.dumps({"max_in_flight": cfg.max_in_flight, "batch": cfg.batch,
                                                     "files": max(1, cfg.batch // max(1, cfg.rate)),
                                                     "connect": cfg.backend == "connect",
                                                     "verify": cfg.verify and cfg.mode == "words"}))


def dag_file(cfg: ChaosConfig) -> Path:
    """The DAG file that declares the run's topologies (what ``airflow-txn audit`` runs them from)."""
    if cfg.mode == "payments":
        return PAYMENTS_CONNECT_DAG_FILE if cfg.backend == "connect" else PAYMENTS_DAG_FILE
    return {"kafka": KAFKA_DAG_FILE, "s3": S3_DAG_FILE}.get(cfg.mode, DAG_FILE)


def dag_env(cfg: ChaosConfig) -> dict[str, str]:
    """What the deployed DAG files read from the environment: the payments example's schedule
    (daily: the harness triggers the runs) and batch size."""
    if cfg.mode != "payments":
        return {}
    return {"AIRFLOW_TXN_EXAMPLE_SCHEDULE": "@daily", "AIRFLOW_TXN_EXAMPLE_BATCH": str(cfg.batch)}
