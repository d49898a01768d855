"""The documentation site builds with every internal link, anchor and README snippet checked (a
warning fails the build), and a broken one does fail it -- so the docs cannot rot unseen."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]


def build(root: Path, site: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
                          cwd=root, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})


def test_the_docs_site_builds_with_every_link_and_anchor_checked(tmp_path: Path) -> None:
    done = build(REPO, tmp_path / "site")
    assert done.returncode == 0, done.stdout + done.stderr
    page = (tmp_path / "site" / "guides" / "first-topology.html").read_text()
    assert "transactional_dag" in page and "clicks_per_page" in page  # README's section, included
    # The reference pages, generated from the code: every public name, every command.
    from airflow_transactional.cli import parser
    from dev.docs_reference import public_names, subcommands

    api = (tmp_path / "site" / "reference" / "python.html").read_text()
    for module, name, _obj in public_names():
        assert f"from {module} import {name}" in api, name
    commands = (tmp_path / "site" / "reference" / "cli.html").read_text()
    for command in subcommands(parser()):
        assert f"airflow-txn {command}</code>" in commands, command
    from airflow_transactional.airflow import metrics

    sent = set(re.findall(r'name\(topology_id, "(\w+)"\)', Path(metrics.__file__).read_text()))
    table = (tmp_path / "site" / "reference" / "metrics.html").read_text()
    assert len(sent) >= 10 and all(f"<code>{m}</code>" in table for m in sent), sent
    sql = (REPO / "provider" / "airflow_transactional" / "store" / "schema" / "0001_first_release.sql").read_text()
    tables = (tmp_path / "site" / "reference" / "state-store.html").read_text()
    created = re.findall(r"^CREATE TABLE \{s\}\.(\w+)", sql, re.M)
    assert len(created) >= 10 and all(f"<code>{t}</code>" in tables for t in created), created
    from dev.docs_reference import CONNECTION_KINDS, conn_parameters

    conns = (tmp_path / "site" / "reference" / "connections.html").read_text()
    assert set(conn_parameters()) == set(CONNECTION_KINDS)
    assert all(f"<code>{kind}</code>" in conns for kind in CONNECTION_KINDS.values())
    assert "<code>sasl.username</code>" in conns and "<code>state_schema</code>" in conns


def test_a_connection_parameter_without_a_reference_entry_fails_the_build(monkeypatch: pytest.MonkeyPatch) -> None:
    from dev import docs_reference

    def new_api(*, ledger_conn_id: str = "ledger_default") -> None: ...

    monkeypatch.setattr(docs_reference, "public_names", lambda: [("airflow_transactional", "new_api", new_api)])
    with pytest.raises(ValueError, match=r"\['ledger_conn_id'\] have no entry in dev/docs_reference.py"):
        docs_reference.render("connections")


@pytest.mark.parametrize(("page", "breakage", "said"), [
    ("concepts.md", "\nSee [the missing page](nowhere.md).\n", "nowhere.md"),
    ("concepts.md", "\nSee [a missing anchor](guides/ui.md#no-such-heading).\n", "no-such-heading"),
    ("guides/first-topology.md", '\n--8<-- "README.md:no-such-section"\n', "no-such-section"),
])
def test_a_broken_link_anchor_or_snippet_fails_the_build(tmp_path: Path, page: str, breakage: str, said: str) -> None:
    root = tmp_path / "repo"
    shutil.copytree(REPO / "docs", root / "docs")
    shutil.copytree(REPO / "dags", root / "dags")  # the pages include sections of the example DAGs
    for name in ("mkdocs.yml", "README.md", "dev/docs_results.py", "dev/docs_reference.py"):
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO / name, root / name)
    with open(root / "docs" / page, "a") as out:
        out.write(breakage)
    done = build(root, tmp_path / "site")
    assert done.returncode != 0 and said in done.stdout + done.stderr, done.stdout + done.stderr


def test_a_results_marker_becomes_the_table_its_run_wrote() -> None:
    import json

    from dev import docs_results

    written = json.loads((REPO / "docs" / "results" / "demo-soak.json").read_text())
    page = docs_results.on_page_markdown("Its last run:\n\n<!-- results:demo-soak -->\n")
    assert "<!-- results:" not in page and f"commit `{written['commit']}`" in page
    for name, t in written["topologies"].items():
        assert f"| `{name}` | {t['commits']} | {t['drivers_killed']} |" in page
    with pytest.raises(ValueError, match="no table for results:nothing: one of big-object, demo-soak, bench"):
        docs_results.on_page_markdown("<!-- results:nothing -->")
    with pytest.raises(ValueError, match=r"bench-nothing\.json: run `python -m bench\.perf"):
        docs_results.on_page_markdown("<!-- results:bench-nothing -->")
    with pytest.raises(ValueError, match=r"only a bench\.perf report has sections"):
        docs_results.on_page_markdown("<!-- results:demo-soak:commit -->")


def test_a_section_marker_renders_that_section_of_the_benchmark(tmp_path: Path) -> None:
    from dev import docs_results

    def row(section: str, measure: str) -> dict[str, object]:
        return {"section": section, "measure": measure, "ours": "1 s", "baseline": "2 s", "ratio": 0.5,
                "target": "<= 1x", "met": True, "note": f"note of {measure}"}

    r = {"rows": [row("commit", "a commit"), row("vs Structured Streaming", "a batch")]}
    page = docs_results.bench(r, "vs-structured-streaming")
    assert "| a batch | 1 s | 2 s | 0.50x | <= 1x | yes |" in page and "- note of a batch" in page
    assert "a commit" not in page and "`python" not in page  # a report without its command says none
    r["command"] = "python -m bench.perf --only commit"
    assert docs_results.bench(r, "commit").endswith("- note of a commit\n\n`python -m bench.perf --only commit`")
    with pytest.raises(ValueError, match="no rows of section 'plan': one of commit, vs-structured-streaming"):
        docs_results.bench(r, "plan")


def test_every_link_of_the_readme_reaches_a_file() -> None:
    """The README is outside the site (its sections the site includes are checked there): its own
    links to the docs' pages are checked here."""
    links = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", (REPO / "README.md").read_text())
    local = [link for link in links if "://" not in link]
    assert len(local) >= 10, local
    assert [link for link in local if not (REPO / link).is_file()] == []


def test_a_chaos_run_writes_the_table_the_chaos_page_renders(tmp_path: Path) -> None:
    import json

    from bench.chaos.__main__ import write_json
    from bench.chaos.config import ChaosReport
    from dev import docs_results

    report = ChaosReport(seed=3, transactions_committed=12, events_lost=1, problems=["run r1 never finished"])
    started = {"date": "2026-11-27T10:00:00+00:00", "commit": "abc1234", "machine": "2 cores",
               "command": "python -m bench.chaos --seed 3"}
    write_json(tmp_path / "chaos-x.json", started, report)
    page = docs_results.chaos(json.loads((tmp_path / "chaos-x.json").read_text()))
    assert "| transactions committed | 12 |" in page and "| events lost | 1 |" in page, page
    assert "- **run r1 never finished**" in page and page.endswith("`python -m bench.chaos --seed 3`")
    noted = docs_results.chaos({**json.loads((tmp_path / "chaos-x.json").read_text()), "note": "Ran on abc."})
    assert noted.endswith("`python -m bench.chaos --seed 3`\n\nRan on abc.")


#: What a measured figure looks like in prose: a ratio, CPU-seconds, a rate, memory, a percentile, a test count.
MEASURED = re.compile(r"\b\d[\d,]*(?:\.\d+)?x\b|\d\s?(?:CPU-s|ev/s|MiB|GiB)\b|\bp(?:50|99)\b|\b\d+ (?:tests )?passed\b")


def prose(text: str) -> str:
    """A page less its code blocks, inline code and results markers (what a run writes, not a person)."""
    text = re.sub(r"^(\s*)```.*?^\1```$", "", text, flags=re.S | re.M)
    return re.sub(r"`[^`\n]*`|<!-- results:[^>]* -->", "", text)


def test_no_measured_figure_is_typed_into_the_docs() -> None:
    """Figures come from the runs' JSON (docs/results/), rendered when the site is built."""
    pages = [p for p in (REPO / "docs").rglob("*.md") if "examples" not in p.parts] + [REPO / "README.md"]
    typed = [f"{p.relative_to(REPO)}: {m.group(0)!r} in ...{prose(p.read_text())[max(m.start() - 40, 0):m.end()]}"
             for p in pages for m in MEASURED.finditer(prose(p.read_text()))]
    assert typed == []
    assert MEASURED.search(prose("ours took 0.94x the peer's 14.9 CPU-s")) and not MEASURED.search(prose("`2x`"))


def _table_rows_without_a_header(text: str) -> list[str]:
    """The first line of each run of table rows (lines starting with '|') whose second line is not
    a header's separator: Markdown renders those as plain text. Code blocks are skipped."""
    found, run, fenced = [], [], False
    for line in [*text.splitlines(), ""]:
        if line.lstrip().startswith("```"):
            fenced = not fenced
        if not fenced and line.startswith("|"):
            run.append(line)
            continue
        if run and (len(run) < 2 or not re.fullmatch(r"\|(\s*:?-{3,}:?\s*\|)+", run[1].replace(" ", ""))):
            found.append(run[0][:80])
        run = []
    return found


def test_every_table_of_the_docs_has_its_header() -> None:
    assert _table_rows_without_a_header("| a | b |\n| --- | --- |\n| 1 | 2 |\n\ntext\n| 3 | 4 |\n") == ["| 3 | 4 |"]
    pages = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
    bad = {str(p.relative_to(REPO)): rows for p in pages if (rows := _table_rows_without_a_header(p.read_text()))}
    assert not bad, bad
