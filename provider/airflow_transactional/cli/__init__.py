"""``airflow-txn``: inspect and repair topologies from the command line.

The store is found from ``--dsn-file`` (or ``$AIRFLOW_TXN_DSN_FILE``), else ``$AIRFLOW_TXN_DSN``,
else the Airflow connection named by ``--conn-id`` (default ``transactional_default``) when
Airflow is configured. ``--dsn`` works too, but a password on the command line shows in ``ps``
and in the shell's history: prefer the others.

One function per subcommand (``set_defaults(func=...)``); each gets the parsed arguments and a
:class:`~airflow_transactional.coordinator.Coordinator` (``spark-cds`` needs no store) and returns
the exit code. A module per group of commands -- :mod:`.operating`, :mod:`.history`,
:mod:`.corrections`, :mod:`.quarantine`, :mod:`.spark` -- each adding its own to the parser
(:mod:`.main`); :mod:`.args` holds what they share.
"""

from .main import main, parser

__all__ = ["main", "parser"]
