"""The verify task of a topology declared with ``verify=``: after the run's commit, a round of the
shadow audit (``core/verify.py``) -- the topology's job on a verify round's request (``--recompute``),
by spark-submit or on its Spark Connect server, as the process task runs it -- in a pool of its own
(``verify_pool``) at the lowest priority, so it never takes the processing's slots. A round with
nothing to recompute costs no spark-submit: the task settles first what needs no recomputing (an
empty batch, a txid not sampled, input gone) and starts the job only for the rest, its driver's
JIT chosen by their size as the process task's is -- or, with ``verify_lag``, once more than that
many wait, recomputed together. Its ``spark-submit`` runs at the lowest CPU priority (nice 19):
where the processing keeps this machine's cores busy, a round takes what it leaves. A job that
dies is tried again. The task fails while a check has failed, naming the txid, the states and the
keys -- at once, without retries, and so does each run's verify task after it (the DAG's failure
callbacks fire) until the txid is checked again (``airflow-txn verify --recheck``); the metrics
``verified_through`` and ``verification_failures`` follow the mark."""

from __future__ import annotations

from typing import Any

from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook
from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
from airflow.sdk.exceptions import AirflowFailException

from ...coordinator import VerificationRound
from ...ranges import Round
from ...spark.recompute import deliver_request
from ...spark.submit import DsnDelivery, lowest_priority
from .. import metrics
from ..hooks import TransactionalHook
from .process import TransactionalSparkSubmitOperator, dag_version


class VerifyOperator(TransactionalSparkSubmitOperator):
    """A round of the shadow audit: up to N committed txids (1 in K sampled) recomputed and checked."""

    ui_color = "#ede7f6"

    def __init__(self, *, verify_round: str = "10", verify_lag: int = 0, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.verify_round, self.verify_lag = verify_round, verify_lag
        self._request = DsnDelivery()
        self._round: VerificationRound | None = None  # execute() sets it

    def job_args(self, txid: int, schema: str) -> list[str]:
        return [*self.base_application_args, "--topology", self.topology_id, *self._request.app_args,
                "--schema", schema]

    def _get_hook(self) -> SparkSubmitHook:
        """The process task's hook, its ``spark-submit`` started at the lowest CPU priority."""
        hook = super()._get_hook()
        submit = hook.submit

        def niced(application: str = "", **kwargs: Any) -> Any:
            return submit(application, preexec_fn=lowest_priority, **kwargs)

        hook.submit = niced  # type: ignore[method-assign]
        return hook

    def execute(self, context: Any) -> None:
        hook = TransactionalHook(self.transactional_conn_id)
        budget, every = Round.parse(self.verify_round, "verify")
        with hook.coordinator() as coordinator:
            # The round's first half here: what needs no recompute is settled without a job.
            found = coordinator.verify_triage(self.topology_id, budget=budget, every=every,
                                              lag=self.verify_lag)
            if found["recompute"]:
                self.log.info("recomputing txids %s of %s (%d records)", ", ".join(map(str, found["recompute"])),
                              self.topology_id, found["records"])
                self.dag_version = dag_version(context)
                self._round = VerificationRound(self.topology_id, budget, every)
                try:
                    self._recompute(context, coordinator.schema, hook.get_dsn(), found)
                finally:
                    self._request.remove()
            else:
                self.log.info("no committed txid of %s to recompute now%s", self.topology_id,
                              " (another round is running)" if found["busy"] else
                              f" ({found['waiting']} wait, verify_lag={self.verify_lag})" if found["waiting"] else "")
            status = coordinator.verify_status(self.topology_id, 1, 0)
        metrics.verified(self.topology_id, verified_through=status["verified_through"],
                         failures=int(status["counts"].get("failed", 0)))
        self.log.info("topology %s: verified through txid %d of %d committed (%s)", self.topology_id,
                      status["verified_through"], status["committed_txid"],
                      ", ".join(f"{s} {n}" for s, n in sorted(status["counts"].items())))
        if status["failures"]:
            raise AirflowFailException(failed_checks(self.topology_id, status["failures"]))

    def ship_request(self, deploy_mode: str | None) -> list[str]:
        """The round's request in a private file: its path for a driver or client here, shipped beside
        a cluster-mode driver."""
        assert self._round is not None, "a verify round's request before execute() chose the round"
        self._request = deliver_request(self._round, deploy_mode)
        return self._request.files

    def _recompute(self, context: Any, schema: str, dsn: str, found: dict[str, Any]) -> None:
        """The job on this task's request: a Spark Connect client, or a ``spark-submit`` (the Spark
        connection resolved once, by :meth:`prepare_submit`)."""
        if self.spark_connect_conn_id:
            self.ship_request(None)
            self.application_args = self.job_args(0, schema)
            self.run_connect_client(self.spark_connect_conn_id, dsn)
            return
        delivery = self.prepare_submit(0, schema, dsn, batch=found["batch"], planned_records=found["records"])
        try:
            SparkSubmitOperator.execute(self, context)
        finally:
            delivery.remove()

def failed_checks(topology_id: str, failures: list[dict[str, Any]]) -> str:
    """What failed, in a few lines: each failed txid with its states and first keys, and what to do."""
    lines = [f"topology {topology_id!r}: {len(failures)} committed txid(s) failed their check"]
    for failure in failures[:5]:
        detail = failure["detail"]
        found = {**detail.get("differences", {}), **detail.get("states", {})}
        keys = "; ".join(f"{name}: {', '.join(str(s['key']) for s in d.get('samples', [])[:3])}"
                         for name, d in found.items() if isinstance(d, dict) and d.get("samples"))
        lines.append(f"  txid {failure['txid']}: {detail.get('reason') or 'recomputed, it differs'}"
                     + (f" ({keys})" if keys else f" ({', '.join(sorted(found))})" if found else ""))
    lines.append(f"see `airflow-txn verify {topology_id} --status`; once mended, check again with `--recheck A..B`")
    return "\n".join(lines)
