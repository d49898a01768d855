# The two commands of the README: `make demo` and `make test`. Each creates the virtualenv
# and installs the pinned stack when it is missing, then does its job.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: demo test docs bench bench-check venv lint clean startup-archive browser jars redis

venv: $(STAMP)

$(STAMP): requirements/constraints.txt setup.cfg pyproject.toml
	@command -v java >/dev/null || { echo "Java 17+ is needed for Spark: install a JDK (e.g. apt-get install openjdk-17-jre-headless)"; exit 1; }
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip setuptools wheel
	$(BIN)/python -m pip install --quiet -c requirements/constraints.txt -e '.[test,dev]'
	$(BIN)/python -m pip check
	touch $(STAMP)

# The class-data-sharing archive that saves each small spark-submit about a fifth of its CPU and
# time (docs/guides/deployment.md): built once per machine, found at once
# afterwards. Without it Spark jobs still run, only slower to start.
startup-archive: $(STAMP)
	$(BIN)/airflow-txn spark-cds || echo "(no class-data-sharing archive: Spark drivers start without one)"

# Jars from Maven Central, fetched once per machine with Maven (installed here when missing, as
# root): Spark's Kafka connector and Hadoop's s3a, and the servers the demo and the tests start
# (the Kafka broker, S3Proxy, S3Mock for a bucket that keeps versions, an HDFS NameNode and DataNode).
jars: $(STAMP)
	@command -v mvn >/dev/null || { \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq maven; \
	  else echo "fetching the Kafka jars needs Maven: sudo apt-get install maven"; exit 1; fi; }
	$(BIN)/airflow-txn fetch-jars
	$(BIN)/python -m dev.kafka fetch
	$(BIN)/python -m dev.s3 fetch
	$(BIN)/python -m dev.s3versioned fetch
	$(BIN)/python -m dev.hdfs fetch

demo: startup-archive jars $(if $(CLUSTER),redis)
	PATH="$(abspath $(BIN)):$$PATH" $(BIN)/python -m dev.demo $(if $(CLUSTER),--cluster) $(if $(filter 1,$(SPARK_CONNECT)),--spark-connect)$(if $(filter 0,$(SPARK_CONNECT)),--spark-submit)

# The browser test drives Debian's Chromium and ChromeDriver: installed here when missing (as root,
# as on CI; otherwise this says what to install).
browser:
	@test -x /usr/bin/chromium -a -x /usr/bin/chromedriver || { \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver; \
	  else echo "the browser test needs Debian's Chromium: sudo apt-get install chromium chromium-driver"; exit 1; fi; }

# The cluster tier's Celery broker is Debian's redis-server: installed here when missing (as root,
# as on CI; otherwise this says what to install). The stack starts and removes its own server.
redis:
	@command -v redis-server >/dev/null || { \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server; \
	  else echo "the cluster tier needs Debian's redis-server: sudo apt-get install redis-server"; exit 1; fi; }

# The house rules first (ruff, mypy: seconds), then every tier of the suite, in three lanes side by
# side (dev/lanes.py: the e2e tier; the cluster tier and a share of the Spark stories; the others). For development
# one tier runs alone:
# `make test TIER=unit` (or integration, spark, e2e, cluster); CI runs them all.
test: startup-archive lint browser jars redis
	PATH="$(abspath $(BIN)):$$PATH" $(BIN)/python $(if $(TIER),-m pytest tests -m $(TIER),-m dev.lanes)

# The documentation site, from docs/ and mkdocs.yml, into var/site (offline; every internal link and
# anchor checked, a warning is an error). The suite builds it too (tests/unit/test_docs.py).
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

# The benchmarks against the alternatives (docs/benchmarks.md); `make bench QUICK=1` is the
# under-ten-minutes variant. Prints the table, writes docs/benchmarks.png.
bench: startup-archive
	$(BIN)/python -m pip install --quiet -c requirements/constraints.txt -e '.[bench]'
	PATH="$(abspath $(BIN)):$$PATH" $(BIN)/python -m bench.perf $(if $(QUICK),--quick) $(BENCH_ARGS)

# The regression guard before a change to the processing or commit path lands (a few minutes): the
# work section, its ratios beside the committed docs/results/bench.json, a verdict per row.
bench-check: startup-archive
	$(BIN)/python -m pip install --quiet -c requirements/constraints.txt -e '.[bench]'
	PATH="$(abspath $(BIN)):$$PATH" $(BIN)/python -m bench.check

lint: $(STAMP)
	$(BIN)/ruff check provider tests dags spark_jobs bench dev
	$(BIN)/mypy provider/airflow_transactional dev bench

clean:
	rm -rf $(VENV) var
