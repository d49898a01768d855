"""``python -m airflow_transactional.cli``: the ``airflow-txn`` command."""

import sys

from .main import main

if __name__ == "__main__":
    sys.exit(main())
