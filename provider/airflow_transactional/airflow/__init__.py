"""The Airflow layer: the DAG factory, its operators and triggers, the state store's hook, what a
commit tells the platform (assets, metrics, lineage, deadlines), and the Transactions views."""
