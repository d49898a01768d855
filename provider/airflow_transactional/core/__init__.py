"""The transaction core, one concept a module, over one :class:`~.context.StateStore`:
``model`` (what a transaction is), ``registration``, ``planning``, ``attempts``, ``commit`` (the
commit protocol, top to bottom), ``commit_external`` (states in other databases), ``liveness``,
``status``, ``rebuild``. ``airflow_transactional.coordinator`` is the front that users and the
Airflow and Spark layers call. No Airflow, no Spark here."""
