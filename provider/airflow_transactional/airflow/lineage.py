"""What the three tasks tell OpenLineage when ``apache-airflow-providers-openlineage`` is installed
and configured (a transport): the datasets a topology reads and writes, and the transaction a
run is.

* inputs: the source -- an event log in the state store, or a landing directory;
* outputs (the commit, which writes them): each state table and each output log, with the rows
  or events the commit wrote (``outputStatistics``);
* a run facet ``transactional``: topology, txid, the attempt the commit took, the batch's start
  and end offsets, its records, whether it is committed.

Names follow OpenLineage's naming: a Postgres table is ``<database>.<schema>.<table>`` in
namespace ``postgres://<host>:<port>``; an event log, which is rows of ``log_events`` of its
schema, is ``<database>.<schema>.log.<log name>`` in the same namespace -- so stage 1's output
log and stage 2's source are one dataset, and a lineage graph joins the stages. A landing
directory is its path in namespace ``file``; one on S3 its prefix in ``s3://<bucket>``, one on HDFS
its path in ``hdfs://<namenode>:<port>`` (OpenLineage's naming).

The ``spark-submit`` of the process task gets the parent job's identity (the Apache Spark
provider's ``openlineage_inject_parent_job_info``, on by default here when OpenLineage is
installed), so the OpenLineage Spark listener, when the cluster has it, links Spark's own events
to the Airflow task.

Nothing here is imported unless OpenLineage asks (the provider works without it).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

from psycopg2.extensions import parse_dsn

from ..spec import TopologySpec
from .hooks import AIRFLOW_CONNECTIONS

#: The run facet's key in an OpenLineage event.
RUN_FACET = "transactional"
PRODUCER = "https://pypi.org/project/airflow-provider-transactional/"
SCHEMA_URL = "https://pypi.org/project/airflow-provider-transactional/#TransactionalRunFacet"


@functools.cache
def installed() -> bool:
    """Whether the OpenLineage provider can be imported here (asked once per process: every
    process operator of a DAG file asks at parse time)."""
    try:
        import airflow.providers.openlineage  # noqa: F401
    except ImportError:
        return False
    return True


def store_namespace(dsn: str) -> tuple[str, str]:
    """(namespace, database) of the state store's Postgres, as OpenLineage names them."""
    params = parse_dsn(dsn)
    host = params.get("host") or "localhost"
    if host.startswith("/"):  # a Unix socket: the server is this machine's
        host = "localhost"
    return f"postgres://{host}:{params.get('port') or 5432}", params.get("dbname") or "postgres"


def dataset_names(spec: TopologySpec, store_schema: str, database: str) -> tuple[tuple[str, str] | None,
                                                                               list[tuple[str, str, str]]]:
    """The source as (namespace kind, name) -- kind ``postgres``, ``file`` or a Kafka, S3 or HDFS namespace -- and the
    outputs as (kind ``state`` or ``log``, its name in the topology, dataset name)."""
    source = spec.source.dataset(database, store_schema)
    outputs = []
    for state in spec.states:
        schema, table = state.schema_and_table
        outputs.append(("state", state.name, f"{state.database or database}.{schema}.{table}"))
    for out in spec.outputs:
        outputs.append(("log", out.name, f"{database}.{store_schema}.log.{out.log_name}"))
    return source, outputs


@functools.cache
def _run_facet_class() -> type:
    import attrs
    from openlineage.client.facet_v2 import RunFacet

    @attrs.define
    class TransactionalRunFacet(RunFacet):
        """The transaction an Airflow task instance worked on."""

        topology: str
        txid: int
        attempt: int | None = None
        startOffsets: dict[str, Any] = attrs.field(factory=dict)
        endOffsets: dict[str, Any] = attrs.field(factory=dict)
        records: int = 0
        committed: bool = False

        @staticmethod
        def _get_schema() -> str:
            return SCHEMA_URL

    return TransactionalRunFacet


def operator_lineage(topology: Mapping[str, Any], dsn: str, store_schema: str, transaction: Any,
                     commit: Mapping[str, Any] | None, *, writes: bool) -> Any:
    """The ``OperatorLineage`` of one task of a run: its topology's source, the outputs when the
    task ``writes`` (the commit), the transaction (None: the run has none) and the ``commit``
    entry of its txid (None: not committed)."""
    from airflow.providers.openlineage.extractors import OperatorLineage
    from openlineage.client.event_v2 import InputDataset, OutputDataset
    from openlineage.client.facet_v2 import output_statistics_output_dataset

    spec = TopologySpec.from_config(topology, AIRFLOW_CONNECTIONS)
    namespace, database = store_namespace(dsn)
    source, outputs = dataset_names(spec, store_schema, database)
    inputs = [] if source is None else [InputDataset(namespace=namespace if source[0] == "postgres" else source[0],
                                                name=source[1])]
    out: list[Any] = []
    if writes:
        rows = dict((commit or {}).get("row_counts") or {})
        for _kind, name, dataset in outputs:
            facets: dict[str, Any] = {}
            if name in rows:  # rows a state's table took, events an output log took
                facets["outputStatistics"] = output_statistics_output_dataset.OutputStatisticsOutputDatasetFacet(
                    rowCount=int(rows[name]))
            out.append(OutputDataset(namespace=namespace, name=dataset, outputFacets=facets))
    run_facets: dict[str, Any] = {}
    if transaction is not None:
        run_facets[RUN_FACET] = _run_facet_class()(
            topology=spec.topology_id, txid=int(transaction.txid),
            attempt=None if commit is None else commit.get("attempt"),
            startOffsets=dict(transaction.start_offsets or {}), endOffsets=dict(transaction.end_offsets or {}),
            records=int(transaction.planned_records or 0), committed=commit is not None)
    return OperatorLineage(inputs=inputs, outputs=out, run_facets=run_facets)
