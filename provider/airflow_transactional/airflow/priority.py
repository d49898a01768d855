"""Which waiting task Airflow starts first: the priority weight of a topology's tasks.

Airflow 3.3's scheduler starts waiting tasks by priority weight, then by the run's logical date,
oldest first (``SchedulerJobRunner._executable_task_instances_to_queued``). That is fair between
scheduled runs -- a topology that fell behind has the oldest runs -- but a run started by an asset
event has no logical date, and PostgreSQL sorts it after every dated one: on a saturated pool,
the second stage of a pipeline waits until no scheduled run of any other DAG wants a slot, and its
lag grows without bound. :class:`TransactionalPriority` gives the tasks of such runs a weight above
any scheduled run's, and within a run finishes transactions before it starts new ones (commit over
process over plan).

The weight is computed from the run id alone, when the scheduler creates the task instances: no
database access, no state of its own (Airflow stores the strategy by class name and calls it in
the scheduler). The provider's plugin registers it (``priority_weight_strategies``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from airflow.task.priority_strategy import PriorityWeightStrategy
from airflow.utils.types import DagRunType

if TYPE_CHECKING:
    from airflow.models.taskinstance import TaskInstance

#: Added to the weight of every task of an asset-triggered run: above any weight a scheduled run's
#: tasks get from their own ``priority_weight`` (one each by default, summed over upstream tasks).
ASSET_TRIGGERED_BOOST = 10_000

_UNDATED = {DagRunType.ASSET_TRIGGERED, DagRunType.ASSET_MATERIALIZATION}


class TransactionalPriority(PriorityWeightStrategy):
    """A task's own ``priority_weight`` plus its upstream tasks' (so commit > process > plan),
    plus :data:`ASSET_TRIGGERED_BOOST` when its run was started by an asset event."""

    def get_weight(self, ti: TaskInstance) -> int:
        task = ti.task
        if task is None:
            return 1
        weight = int(task.priority_weight)
        dag = task.get_dag()
        if dag is not None:
            weight += sum(int(dag.task_dict[t].priority_weight) for t in task.get_flat_relative_ids(upstream=True))
        if undated(ti.run_id):
            weight += ASSET_TRIGGERED_BOOST
        return weight


def undated(run_id: str) -> bool:
    """Whether a run of this id was started by an asset event (and so has no logical date)."""
    return DagRunType.from_run_id(run_id) in _UNDATED
