"""Exactly-once under faults: run ``words`` on the real stack, break things, check an oracle.

Jepsen-style: producers append tweets to an event log (with duplicate deliveries and malformed
records), the harness triggers transactions over the REST API the UI uses, and injects faults at
random -- seeded, so a run can be replayed:

  spark_kill              SIGKILL of a running spark-submit driver JVM (driver and executors)
  commit_kill_before      the commit task's process dies just before the Postgres COMMIT
  commit_kill_after       ... right after COMMIT returned, before Airflow records success
  pg_restart_processing   Postgres restarted (fast shutdown) while a Spark batch runs
  pg_restart_commit       Postgres restarted while a commit transaction is open
  scheduler_restart       the scheduler (and the LocalExecutor workers it owns) SIGKILLed, restarted
  api_restart             the api-server SIGKILLed and restarted
  clear                   a random task of a random run cleared (committed runs included)

It plays the operator too, as documented in docs/guides/operating.md: a component that
died is restarted (what systemd or Kubernetes would do) and a failed run is cleared. At the end
it drains the log and checks, independently of the provider's code paths:

* the state tables equal an oracle computed from what the producers appended, by event id;
* the audit log (``commits``) holds txids 1..N, each once, committed in increasing order;
* the quarantine holds exactly the malformed records injected, each once;
* no run is left unfinished.

``--mode payments`` runs the payments example's two stages instead (``payments.py``): the
faults strike either stage, and the checks are the example's invariants -- every request decided
exactly once, no account below its limit at any commit, each grant once outgoing and once
incoming, money conserved, statements equal to balances -- plus both topologies' commit order.

``--mode kafka`` reads ``words`` from a Kafka topic (``kafka.py``): producers send in Kafka
transactions and abort some, and the broker's own faults strike too --

  kafka_kill_processing   the broker SIGKILLed (and restarted) while a batch is processed
  kafka_kill_commit       ... while a commit transaction is open
  delete_records          records deleted up to the middle of a planned, uncommitted range
  add_partition           a partition added to the topic

-- and the checks are the words checks on the records the producers committed, less those the
(opaque) topology reported skipped, each skipped range lying below a deletion the harness made.

``--mode s3`` reads ``words`` from files landed in an S3 bucket (``objects.py``): producers upload
files (and now and then one again, byte for byte), and the store's own faults strike too --

  s3_kill_processing      the S3 server SIGKILLed (and restarted) while a batch is processed
  object_overwrite        a file of a planned, uncommitted txid uploaded again with other records
  object_delete           ... deleted
  slow_get                object reads held and trickled for a while

-- and the checks are the words checks on every version uploaded, less those the (opaque) topology
reported lost, each lost one a version the harness overwrote or deleted.

``python -m bench.chaos --quick`` is the quick size (minutes); ``python -m bench.chaos`` the soak.

Its parts: ``config.py`` (what a run is asked, what it found), ``workload.py`` (the producers and
the ledger, the oracle's input), ``faults.py`` (the fault lanes), ``supervisor.py`` (restarting
what died), ``checker.py`` (the checks), ``payments.py``, ``kafka.py`` and ``objects.py`` (each mode's producers,
set-up and checks), ``harness.py`` (one run), ``__main__.py`` (the command).
"""

from .config import (
           KAFKA_KINDS,
           KINDS,
           LEDGER,
           LOG,
           MODES,
           OBJECT_KINDS,
           TOPOLOGY,
           ChaosConfig,
           ChaosReport,
           dag_env,
           write_dag,
)
from .harness import Chaos, chaos_stack, recheck
from .workload import Ledger, Producer, domain_of

__all__ = ["KAFKA_KINDS", "KINDS", "LEDGER", "LOG", "MODES", "OBJECT_KINDS", "TOPOLOGY", "Chaos", "ChaosConfig",
           "ChaosReport", "Ledger", "Producer", "chaos_stack", "dag_env", "domain_of", "recheck", "write_dag"]
