"""The tasks of a transaction run: plan, process (spark-submit), commit -- and publish, when its
outputs go to Kafka, and verify, when the topology checks its commits as they come.

Operators keep their arguments in ``__init__`` and build hooks in ``execute``; nothing here
touches a database at DAG-parse time. Order is enforced in PostgreSQL, not by
``depends_on_past`` (see :mod:`airflow_transactional.airflow.dag` for why).
"""

from .base import DELETED, TopologyTask, WaitingTask
from .commit import CommitOperator
from .plan import PlanOperator
from .process import TransactionalSparkSubmitOperator
from .publish import PublishOperator
from .verify import VerifyOperator

__all__ = ["DELETED", "CommitOperator", "PlanOperator", "PublishOperator", "TopologyTask",
           "TransactionalSparkSubmitOperator", "VerifyOperator", "WaitingTask"]
