"""A recomputation as one typed request: what ``airflow-txn`` and the verify task hand the Spark
job (``--recompute FILE``) -- each kind of the engine written and read back whole, anything else
refused naming what is wrong, the file private and shipped beside a cluster-mode driver."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from airflow_transactional.coordinator import (
    Audit,
    CorrectionPreview,
    Rebuild,
    StateBuild,
    VerificationRound,
    from_request,
    request,
)
from airflow_transactional.exceptions import ConfigError
from airflow_transactional.spark.job import parse_args
from airflow_transactional.spark.recompute import RECOMPUTE_ARG, SHIPPED_REQUEST, deliver_request, read_request

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("kind", [Audit("words"), Audit("words", tries=5), Rebuild("words"), StateBuild("words"),
                                  CorrectionPreview("words", 2, 4), VerificationRound("words", 10, 3)])
def test_each_kind_is_read_back_as_it_was_asked(kind: object) -> None:
    asked = request(kind)  # type: ignore[arg-type]
    assert from_request(json.loads(json.dumps(asked))) == kind
    assert "code" not in asked  # the job records the code it recomputes with, never the asker


def test_the_code_a_kind_carries_stays_out_of_its_request() -> None:
    asked = request(CorrectionPreview("words", 1, 2, code={"application": "sha256:x"}))
    assert asked == {"kind": "preview", "topology_id": "words", "first": 1, "last": 2}


@pytest.mark.parametrize(("given", "said"), [
    (["audit"], "a JSON object whose kind is one of ['audit', 'build', 'preview', 'rebuild', 'verify']"),
    ({"kind": "drop", "topology_id": "words"}, "whose kind is one of"),
    ({"kind": "audit"}, "a request to audit takes ['topology_id', 'tries']"),
    ({"kind": "rebuild", "topology_id": "words", "through": 3}, "a request to rebuild takes ['topology_id']"),
    ({"kind": "preview", "topology_id": "words", "first": "2", "last": 4}, "first must be whole numbers from 1"),
    ({"kind": "preview", "topology_id": "words", "first": 0, "last": 4}, "first must be whole numbers from 1"),
    ({"kind": "preview", "topology_id": "words", "first": 5, "last": 4}, "first txid is after its last: 5..4"),
    ({"kind": "verify", "topology_id": "words", "budget": True}, "budget must be whole numbers from 1"),
    ({"kind": "verify", "topology_id": "words", "budget": 10**12}, "a request to verify: its round is a round"),
])
def test_a_request_that_is_not_one_kind_s_is_refused_saying_what(given: object, said: str) -> None:
    with pytest.raises(ConfigError, match=said.replace("[", r"\[").replace("]", r"\]").replace("(", r"\(")):
        from_request(given)


def test_a_request_travels_in_a_private_file_removed_after(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIRFLOW_TXN_SECRETS_DIR", str(tmp_path / "private"))
    here = deliver_request(VerificationRound("words", 5, 2))
    flag, path = here.app_args
    assert flag == RECOMPUTE_ARG and here.files == []
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert read_request(path) == VerificationRound("words", 5, 2)
    args = parse_args(["--topology", "words", *here.app_args])
    assert args.recompute == path and args.txid is None
    here.remove()
    assert not Path(path).exists()
    # A cluster-mode driver runs elsewhere: the file is shipped beside it under a fixed name.
    shipped = deliver_request(Audit("words"), "cluster")
    assert shipped.app_args == [RECOMPUTE_ARG, SHIPPED_REQUEST]
    assert shipped.files == [f"{shipped.local_file}#{SHIPPED_REQUEST}"]
    shipped.remove()


def test_a_file_that_holds_no_request_is_refused_naming_what_writes_one(tmp_path: Path) -> None:
    junk = tmp_path / "junk.json"
    junk.write_text("--verify 10")
    with pytest.raises(ConfigError, match="--recompute takes the file of a recompute request"):
        read_request(str(junk))
    junk.write_text('{"kind": "verify", "topology_id": "words", "budget": 0}')  # a request, its round wrong
    with pytest.raises(ConfigError, match=r"a request to verify: budget must be whole numbers from 1"):
        read_request(str(junk))
    with pytest.raises(SystemExit):  # neither a txid nor a request: argparse says what is required
        parse_args(["--topology", "words"])


@pytest.mark.parametrize(("kind", "niced"), [(StateBuild("words"), True), (Rebuild("words"), False)])
def test_a_state_build_s_local_driver_starts_at_the_lowest_cpu_priority(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, kind: object, niced: bool) -> None:
    """A build runs beside the live topology for as long as its history takes: on this machine its
    driver takes what the batches leave (a rebuild keeps its priority)."""
    import subprocess

    from airflow_transactional.sources import PostgresLogSource
    from airflow_transactional.spark import recompute as module
    from airflow_transactional.spark.submit import lowest_priority
    from airflow_transactional.spec import SparkJob, StateSpec, TopologySpec

    started: dict[str, object] = {}

    def run(argv: list[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
        started.update(kwargs)
        return subprocess.CompletedProcess(argv, 1, "", "")

    monkeypatch.setattr(module.cds, "current", lambda: None)  # no start-up archive built here
    monkeypatch.setattr(module.subprocess, "run", run)
    spec = TopologySpec("words", PostgresLogSource("tweets"), [StateSpec("counts", {"k": "text"})],
                        job=SparkJob(str(tmp_path / "job.py")))
    with pytest.raises(Exception):  # noqa: B017 -- the job "failed": what matters is how it was started
        module.recompute("host=h dbname=d", "airflow_txn", spec, kind, master="local[2]", conf=[])  # type: ignore[arg-type]
    assert (started["preexec_fn"] is lowest_priority) is niced
