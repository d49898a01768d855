"""The provider's part of the Airflow UI: the Transactions views (``plugin``), the API and pages
behind them (``app``, ``pages``). Loaded by Airflow through the ``airflow.plugins`` entry point."""
