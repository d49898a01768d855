"""Errors of the transaction core. Every message names what to do about it."""

from __future__ import annotations


class TransactionalError(Exception):
    """Base class of every error raised by airflow_transactional."""


class ConfigError(TransactionalError, ValueError):
    """A topology, state or source is declared wrongly (raised before anything runs)."""


class DeclarationChanged(ConfigError):
    """A topology with committed progress was re-declared with another source, states or DAG."""

    def __init__(self, topology_id: str, changes: list[str], committed_txid: int) -> None:
        self.changes = changes
        super().__init__(
            f"topology {topology_id!r} is declared differently from the one that has planned and "
            f"committed batches (through txid {committed_txid}): {'; '.join(changes)}. Its committed "
            "offsets and state values belong to the old declaration, so it is refused rather than "
            "skipping or miscounting records (a state may be added: it is built from the history once "
            f"approved, 'airflow-txn evolve {topology_id}'). Give the new declaration a new topology id (it starts "
            "from the beginning of its source), restore the old declaration, or start this one over "
            f"with 'airflow-txn reset {topology_id} --yes' (drops its progress and state tables)"
        )


class TopologyOfAnotherDag(ConfigError):
    """A DAG declares a topology id that another DAG runs: the two would claim each other's runs."""

    def __init__(self, topology_id: str, owner: str, dag_id: str) -> None:
        super().__init__(
            f"topology {topology_id!r} is run by DAG {owner!r}, and DAG {dag_id!r} declares it too: two DAGs "
            f"would claim each other's runs (their run ids match). Give DAG {dag_id!r} a topology id of its "
            f"own; if DAG {owner!r} was renamed {dag_id!r}, start the topology over with "
            f"'airflow-txn reset {topology_id} --yes'"
        )


class UnknownTopology(TransactionalError):
    """The topology was never registered in this state store."""

    def __init__(self, topology_id: str, why: str = "") -> None:
        super().__init__(
            f"topology {topology_id!r} is not registered in this state store{f' ({why})' if why else ''}: "
            "check the name, or call Coordinator.register(spec) first (its DAG's plan task does this)"
        )


class SchemaMismatch(TransactionalError):
    """An existing table does not have the shape the topology declares."""


class NotYourTurn(TransactionalError):
    """A plan or a commit that must wait for other txids first (never a failure by itself).

    ``waiting_for`` says what would end the wait (``"slot"``: a commit freeing a ``max_in_flight``
    slot; ``"commit"``: txid-1 committing); ``blocked_from`` is the txid whose predecessors, failed
    for good, would keep it waiting for ever; ``trigger_args`` what the triggerer needs to wait."""

    waiting_for: str
    blocked_from: int
    trigger_args: dict[str, object]


class TooManyInFlight(NotYourTurn):
    """Planning would exceed ``max_in_flight`` uncommitted transactions."""

    waiting_for = "slot"

    def __init__(self, topology_id: str, in_flight: list[int], max_in_flight: int) -> None:
        self.in_flight = in_flight
        self.blocked_from = max(in_flight) + 1
        self.trigger_args = {"in_flight": in_flight}
        super().__init__(
            f"topology {topology_id!r} already has {len(in_flight)} uncommitted transactions "
            f"(txids {', '.join(map(str, in_flight))}; max_in_flight={max_in_flight}): "
            f"wait for txid {in_flight[0]} to commit, or raise max_in_flight"
        )


class UnknownTransaction(TransactionalError):
    """No transaction with this txid (or run key) exists."""


class WaitingForPredecessor(NotYourTurn):
    """The commit of txid N was asked for while txid N-1 is not committed yet."""

    waiting_for = "commit"

    def __init__(self, topology_id: str, txid: int, committed_txid: int) -> None:
        self.txid = txid
        self.committed_txid = committed_txid
        self.blocked_from = txid
        self.trigger_args = {"txid": txid}
        super().__init__(
            f"topology {topology_id!r}: cannot commit txid {txid} yet, waiting for txid "
            f"{committed_txid + 1} (last committed: {committed_txid}); commits are strictly "
            "in txid order"
        )


class NotProcessed(TransactionalError):
    """Commit was asked for but no complete processing attempt of the current plan exists."""


class StagedOutputIncomplete(TransactionalError):
    """The staged rows of an attempt do not match what the attempt reported writing."""


class BatchUnavailable(TransactionalError):
    """The planned batch can no longer be read from the source (retention, lost files)."""


class SourceUnreachable(TransactionalError):
    """The source did not answer (a Kafka cluster down or out of reach): nothing was planned or read;
    the task fails and Airflow retries it."""


class SourceChanged(TransactionalError):
    """An attempt read other records than an earlier attempt of the same plan: the source changed
    under the plan (compacted, truncated), and a transactional topology cannot take either."""


class StaleAttempt(TransactionalError):
    """An attempt was made for a plan that has since been re-planned, or was superseded."""


class BadRecord(TransactionalError):
    """A record failed parsing or validation; it is quarantined unless the topology fails fast."""


class QuarantineOverLimit(ConfigError):
    """A txid quarantined more of its records than its topology's ``max_quarantined``: not committed
    (a retry would meet the same records: the task fails for good, naming the fix)."""


class ReplayBehindState(TransactionalError):
    """A state value already carries a txid later than the batch being applied."""


class RebuildInProgress(TransactionalError):
    """Another rebuild of the topology has begun and not finished."""


class EmbeddedPostgresError(TransactionalError):
    """The embedded PostgreSQL server could not be set up or started."""


class IdCollision(TransactionalError, LookupError):
    """An event a commit would append is in its log already, with another payload."""

    def __init__(self, log: str, event_id: str) -> None:
        self.log, self.event_id = log, event_id
        super().__init__(f"{event_id!r} is already in log {log!r} with another payload")


class LogLocked(TransactionalError):
    """A commit waited longer than it may for a partition of an output log that another transaction
    holds (a producer that appended and left its transaction open): nothing is committed, the task
    fails and Airflow retries it."""


class ActionRefused(TransactionalError):
    """Airflow refused or could not do a request of the Transactions views: ``status`` is its HTTP
    status, ``detail`` its words."""

    def __init__(self, status: int, detail: str) -> None:
        super().__init__(f"{status}: {detail}")
        self.status = status
        self.detail = detail


class NonDeterministic(TransactionalError):
    """Committed txids re-processed under the code they were committed with gave other deltas."""
