"""The Spark side of a topology, a module per step: ``read`` (a planned batch, one reader per kind
of source), ``validate`` (parse, quarantine), ``stage`` (fold per key, COPY from the executors)
and ``job`` (the entry point ``run``: process, audit, rebuild). Users import
:mod:`airflow_transactional.spark_job`."""
