"""The Airflow assets a topology's commits update: one per state table and one per output log,
one asset event per committed txid; a state table's has the txid as its partition key (an
output log's has none: see :func:`by_txid`).

A downstream DAG scheduled on them with ``PartitionedAssetTimetable`` runs once per committed txid
(Airflow queues one run per partition key, where plain asset schedules merge events that arrive
together), with the txid as its run's ``partition_key`` and the commit's numbers in the event's
``extra``::

    from airflow.sdk import DAG, PartitionedAssetTimetable
    from airflow_transactional import state_asset

    with DAG("word_report", schedule=PartitionedAssetTimetable(assets=state_asset("words", "word_counts"))):
        ...

The event is sent by the commit that commits the txid, and by a retry of that same run when the
try that committed died before Airflow recorded its success (it sent nothing). A clear or backfill
of a run whose txid committed earlier commits nothing and sends nothing.
"""

from __future__ import annotations

from typing import Any

from ..spec import TopologySpec

#: The assets' group in the Airflow UI.
GROUP = "transactional"


def state_asset(topology_id: str, table: str) -> Any:
    """The asset of one state table of a topology (``table`` as declared: the state's name,
    ``table`` or ``"schema.table"``)."""
    from airflow.sdk import Asset

    return Asset(name=f"transactional.{topology_id}.{table}", uri=f"transactional://{topology_id}/{table}",
                 group=GROUP)


def output_asset(topology_id: str, log: str) -> Any:
    """The asset of an output log a topology's commits append to (``log``: the log's name)."""
    from airflow.sdk import Asset

    return Asset(name=f"transactional.{topology_id}.log.{log}", uri=f"transactional://{topology_id}/log/{log}",
                 group=GROUP)


def by_txid(asset: Any) -> bool:
    """Whether a commit's event of ``asset`` is partitioned by txid: a state table's is (a
    downstream report runs once per txid); an output log's is not. Its reader is a next topology,
    which plans whatever the log holds, so events that arrive together may start one run -- and
    Airflow 3.3 queues a partitioned event only for partition-aware schedules, none of which has a
    time part: a next stage scheduled ``AssetOrTimeSchedule(timetable=..., assets=output_asset(...))``
    runs on the event and stays periodic, so Airflow can backfill it."""
    return "/log/" not in str(asset.uri)


def topology_assets(spec: TopologySpec) -> list[Any]:
    """Every asset a topology's commit updates: its state tables, then its output logs."""
    return ([state_asset(spec.topology_id, s.table or s.name) for s in spec.states]
            + [output_asset(spec.topology_id, o.log_name) for o in spec.outputs])


def committed_outlets(outlets: list[Any], stored: TopologySpec) -> list[Any]:
    """The outlets a commit of the stored topology updates: not the table of a state its DAG file
    adds (declared, or being built: ``core/evolution.py``), which has no table and no value yet."""
    kept = {str(a.uri) for a in topology_assets(stored)}
    return [o for o in outlets if str(o.uri) in kept]


def event_extra(topology_id: str, commit: dict[str, Any]) -> dict[str, Any]:
    """What an asset event of a committed txid carries: its entry of the commit log (txid,
    offsets and numbers), as JSON."""
    return {"topology_id": topology_id, "txid": commit["txid"], "start_offsets": commit["start_offsets"],
            "end_offsets": commit["end_offsets"], "records_read": commit["records_read"],
            "row_counts": commit["row_counts"] or {}, "quarantined": commit["quarantined"],
            "committed_at": commit["committed_at"].isoformat()}
