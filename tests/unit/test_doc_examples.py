"""The guides' code samples run: each is included into its page from a file (``docs/examples/``, or
a section of an example DAG of ``dags/``), and here those files are parsed the way Airflow parses
a DAGs folder and their callbacks called the way the provider calls them -- a sample that stops
working fails the suite. A page's Python or YAML block that is not an include fails it too."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import yaml

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "docs" / "examples"
FENCE = re.compile(r"^(\s*)```(\w+)\n(.*?)^\1```$", re.S | re.M)
SNIPPET = re.compile(r'--8<-- "([^":]+)(?::([\w-]+))?"')


def pages() -> list[Path]:
    return sorted(p for p in (REPO / "docs").rglob("*.md") if EXAMPLES not in p.parents)


def test_every_python_or_yaml_block_of_the_docs_is_included_from_a_file_a_test_runs() -> None:
    inline, included = [], set()
    for page in pages():
        for _indent, lang, body in FENCE.findall(page.read_text()):
            if lang not in ("python", "yaml"):
                continue
            code = [ln.strip() for ln in body.splitlines() if ln.strip() and not ln.strip().startswith("#")]
            if not code or not all(SNIPPET.fullmatch(ln) for ln in code):
                inline.append(f"{page.relative_to(REPO)}: {body.strip()[:60]!r}")
            included |= {m.group(1) for ln in code if (m := SNIPPET.fullmatch(ln))}
    assert inline == [], "a sample typed into a page instead of included from a file a test runs"
    examples = {str(p.relative_to(REPO)) for p in EXAMPLES.rglob("*") if p.suffix in (".py", ".yaml")}
    assert examples - included == set(), "an example no page includes"
    assert {"dags/kafka_words.py", "dags/payments.py"} <= included  # run by the demo and the e2e tier


@pytest.fixture
def bag(monkeypatch: pytest.MonkeyPatch) -> Any:
    """``docs/examples/dags`` as Airflow's dag-processor reads it: the folder on ``sys.path``."""
    from airflow.dag_processing.dagbag import DagBag

    monkeypatch.syspath_prepend(str(EXAMPLES / "dags"))
    monkeypatch.delitem(sys.modules, "my_alerts", raising=False)
    dags = DagBag(dag_folder=str(EXAMPLES / "dags"))
    assert dags.import_errors == {}
    assert set(dags.dag_ids) == {"word_report", "transactional_stall_watch", "words", "words_on_kubernetes"}
    return dags


def test_the_stall_watch_sample_pages_through_its_callback(bag: Any, monkeypatch: pytest.MonkeyPatch,
                                                           caplog: pytest.LogCaptureFixture) -> None:
    from airflow_transactional.airflow import metrics, stalls
    from tests.unit.test_stall_watch import NOW, FakeTI, status

    check = bag.dags["transactional_stall_watch"].get_task("check")
    assert check.on_stall == "my_alerts.page_on_call"
    spec = SimpleNamespace(topology_id="words", dag="words")
    coordinator = SimpleNamespace(topologies=lambda: [spec], status=lambda t, **_: status(t, stalled=True),
                                  ask_lags=lambda ids: None,
                                  close=lambda: None)
    monkeypatch.setattr(stalls, "TransactionalHook", lambda conn_id: SimpleNamespace(
        coordinator=lambda: contextlib.nullcontext(coordinator)))
    monkeypatch.setattr(stalls, "datetime", SimpleNamespace(now=lambda tz: NOW,
                                                            fromisoformat=stalls.datetime.fromisoformat))
    monkeypatch.setattr(metrics, "_stats", lambda: SimpleNamespace(gauge=lambda *a, **k: None))
    with caplog.at_level(logging.WARNING, logger="my_alerts"):
        check.execute({"ti": FakeTI()})
    [page] = [r.getMessage() for r in caplog.records if r.name == "my_alerts"]
    assert page.startswith("PAGE: words stalled for 15 min: stalled: no commit for 15 min"), page


def test_the_commit_deadline_sample_calls_its_coroutine(bag: Any, caplog: pytest.LogCaptureFixture) -> None:
    [alert] = bag.dags["words"].deadline
    assert alert.callback.path == "my_alerts.page_late_commit" and alert.callback.kwargs == {"topology_id": "words"}
    import my_alerts

    with caplog.at_level(logging.WARNING, logger="my_alerts"):
        asyncio.run(my_alerts.page_late_commit(**alert.callback.kwargs,
                                               context={"dag_run": {"dag_run_id": "scheduled__2026-11-27T10:00"}}))
    assert caplog.messages == ["PAGE: words: scheduled__2026-11-27T10:00 has not committed in 10 minutes"]


def test_the_downstream_report_sample_reads_its_txid_from_the_asset_event(bag: Any,
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    from airflow_transactional import state_asset

    dag = bag.dags["word_report"]
    assert dag.timetable.asset_condition.name == state_asset("words", "word_counts").name
    event = SimpleNamespace(extra={"txid": 42, "records_read": 1000})
    dag.get_task("report").python_callable(triggering_asset_events={"words": [event]})
    assert capsys.readouterr().out == "txid 42: 1000 records\n"


def test_the_kubernetes_samples_reach_spark_submit_and_grant_what_spark_needs(
        bag: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import airflow.providers.apache.spark.hooks.spark_submit as hook_module

    monkeypatch.setattr(hook_module, "kube_client", object(), raising=False)  # only to track a driver later
    monkeypatch.setenv("AIRFLOW_TXN_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("AIRFLOW_TXN_SPARK_CDS", "off")
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_K8S", json.dumps({
        "conn_type": "spark", "host": "k8s://https://kubernetes.default.svc", "port": 443,
        "extra": {"deploy-mode": "client"}}))
    process = bag.dags["words_on_kubernetes"].get_task("process")
    process.prepare_submit(1, "airflow_txn", "host=db dbname=txn")
    argv = process._get_hook()._build_spark_submit_command(process.application)
    assert argv[1:3] == ["--master", "k8s://https://kubernetes.default.svc:443"]
    conf = dict(a.split("=", 1) for a in argv[argv.index("--conf") + 1::2] if "=" in a and a.startswith("spark."))
    assert conf["spark.kubernetes.namespace"] == "data" and conf["spark.executor.instances"] == "2"
    assert "--deploy-mode" not in argv or argv[argv.index("--deploy-mode") + 1] == "client"
    # The service account the task pods and a cluster-mode driver run as may manage executor pods.
    docs = list(yaml.safe_load_all((EXAMPLES / "kubernetes" / "spark-rbac.yaml").read_text()))
    kinds = {d["kind"]: d for d in docs}
    assert kinds["ServiceAccount"]["metadata"] == {"name": "spark", "namespace": conf["spark.kubernetes.namespace"]}
    [rule] = kinds["Role"]["rules"]
    assert {"pods", "services", "configmaps", "persistentvolumeclaims"} <= set(rule["resources"])
    assert {"create", "get", "list", "watch", "delete"} <= set(rule["verbs"])
    binding = kinds["RoleBinding"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "spark", "namespace": "data"}]
    assert binding["roleRef"]["name"] == kinds["Role"]["metadata"]["name"]
    assert "serviceAccountName=spark" in (REPO / "docs" / "guides" / "cluster.md").read_text()


def test_every_command_of_a_docs_shell_block_names_a_make_target_or_parses() -> None:
    """A shell block's ``make TARGET`` is a target of the Makefile; its ``python -m bench.chaos ...``
    parses with the harness's own arguments."""
    from bench.chaos.__main__ import build_parser

    targets = set(re.findall(r"^([a-z][\w-]*):", (REPO / "Makefile").read_text(), re.M))
    seen = []
    for page in [*pages(), REPO / "README.md"]:
        for _indent, lang, body in FENCE.findall(page.read_text()):
            if lang != "bash":
                continue
            for line in re.sub(r"\\\n\s*", " ", body).splitlines():
                command = line.split("#")[0].split()
                if command[:1] == ["make"]:
                    assert command[1] in targets, f"{page.name}: make {command[1]} is no target"
                elif command[1:3] == ["-m", "bench.chaos"]:
                    build_parser().parse_args(command[3:])  # exits 2 on an unknown argument
                else:
                    continue
                seen.append(command[0])
    assert seen.count("make") >= 4 and len(seen) >= 10, seen
