"""``words`` on Spark on Kubernetes in client mode, as the cluster guide sets it up: the driver in
the task's pod, the executors in pods Spark creates (``spark_k8s`` is a ``spark`` connection to
``k8s://https://kubernetes.default.svc:443``, deploy mode client)."""

from airflow_transactional import PostgresLogSource, StateSpec, transactional_dag

# --8<-- [start:spark-conf]
spark_conf = {
    "spark.kubernetes.container.image": "registry.example/spark-py:4.2.0-py3.11",
    "spark.kubernetes.namespace": "data",
    "spark.executor.instances": "2",
    "spark.pyspark.python": "/usr/bin/python3",  # the executors' interpreter, in their image
}
# --8<-- [end:spark-conf]

words = transactional_dag(
    "words_on_kubernetes",
    source=PostgresLogSource("tweets"),
    states=[StateSpec("url_counts", keys={"url": "text"}, combiner="count")],
    application="../spark_jobs/words.py",
    schedule="* * * * *",
    spark_conn_id="spark_k8s",
    spark_conf=spark_conf,
)
