"""README's "Writing your own topology", followed literally on the real stack: the DAG file, the
Spark job and the producer are taken from README.md itself (not copied here), deployed as a user
would, and the topology commits what the producer appended. README cannot drift again."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path

from dev.localstack import LocalStack, RestClient
from tests.e2e.conftest import REPO, wait_for_runs
from tests.helpers import query


def readme_blocks(section: str) -> list[str]:
    """The ```python blocks of one ``## section`` of README.md, in order."""
    text = (REPO / "README.md").read_text()
    body = text.split(f"\n## {section}\n", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```python\n(.*?)```", body, re.S)


def test_the_readme_topology_example_commits_as_written(stack: LocalStack, client: RestClient, tmp_path: Path) -> None:
    dag_file, job, producer = readme_blocks("Writing your own topology")
    dags = Path(os.environ.get("AIRFLOW__CORE__DAGS_FOLDER") or stack.dags_folder)
    application = re.search(r'application="([^"]+)"', dag_file).group(1)  # type: ignore[union-attr]
    job_path = (dags / application).resolve()
    job_path.parent.mkdir(parents=True, exist_ok=True)
    job_path.write_text(job)
    (dags / "readme_clicks.py").write_text(dag_file)

    # In the shell the demo's banner prepares: the DSN in a private file it names, no password exported.
    dsn_file = tmp_path / "state.dsn"
    dsn_file.write_text(stack.state_dsn)
    dsn_file.chmod(0o600)
    env = {k: v for k, v in os.environ.items() if k != "AIRFLOW_TXN_DSN"}
    said = subprocess.run([sys.executable, "-c", producer], capture_output=True, text=True, check=True, timeout=120,
                          env={**env, "AIRFLOW_TXN_DSN_FILE": str(dsn_file)}).stdout
    assert "AppendResult(appended=2, duplicates=0" in said and "AppendResult(appended=0, duplicates=1" in said

    client.wait_for_dag("clicks")
    client.unpause("clicks")
    run = client.trigger("clicks", (datetime.now(UTC) - timedelta(hours=1)).isoformat())["dag_run_id"]
    wait_for_runs(stack, "clicks", [run])
    dsn = stack.state_dsn
    assert dict(query(dsn, "SELECT page, value FROM clicks_per_page")) == {"/home": 1, "/buy": 1}
    assert dict(query(dsn, "SELECT user_id, value FROM revenue_per_user")) == {"u1": Decimal("19.99")}
