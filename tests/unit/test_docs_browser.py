"""The built docs site as a reader sees it, in headless Chromium (the browser the UI tests use),
opened from disk as ``make docs`` leaves it -- offline, no server: the home page, a how-to whose
sample is included from a file, the benchmarks page with its tables rendered from the run's
JSON and its plot, and the search. Screenshots go to ``var/screenshots/docs-*.png``."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.unit.test_docs import REPO, build

pytestmark = pytest.mark.unit

SHOTS = REPO / "var" / "screenshots"


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("docs") / "site"
    done = build(REPO, out)
    assert done.returncode == 0, done.stdout + done.stderr
    return out


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    from tests.e2e.browsing import chromium

    yield from chromium()


def visit(browser: object, site: Path, page: str, name: str) -> str:
    """Open ``page`` of the site, save its screenshot as ``docs-<name>.png``, return its text."""
    from selenium.webdriver.common.by import By

    browser.get((site / page).as_uri())  # type: ignore[attr-defined]
    SHOTS.mkdir(parents=True, exist_ok=True)
    assert browser.save_screenshot(str(site / f"docs-{name}.png"))  # type: ignore[attr-defined]
    shutil.copy(site / f"docs-{name}.png", SHOTS / f"docs-{name}.png")
    return str(browser.find_element(By.TAG_NAME, "body").text)  # type: ignore[attr-defined]


def test_a_reader_finds_the_guarantee_a_sample_and_the_measured_tables(browser: object, site: Path) -> None:
    home = visit(browser, site, "index.html", "home")
    assert "exactly once" in home.lower() and "Getting started" in home
    kafka = visit(browser, site, "guides/kafka.html", "howto-kafka")
    assert 'KafkaSource("tweets", kafka_conn_id="kafka_default")' in kafka and "--8<--" not in kafka
    bench = visit(browser, site, "benchmarks.html", "benchmarks")
    assert bench.count("Measured ") >= 10 and "<!-- results" not in bench and "at commit" in bench
    loaded = browser.execute_script(  # type: ignore[attr-defined]
        "return [...document.images].filter(i => i.src.endsWith('benchmarks.png')).map(i => i.naturalWidth)")
    assert loaded and loaded[0] > 0, "the benchmark's plot did not load"


def test_the_search_finds_a_page_offline(browser: object, site: Path) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    browser.get((site / "index.html").as_uri())  # type: ignore[attr-defined]
    scripts = browser.execute_script("return [...document.scripts].map(s => s.src)")  # type: ignore[attr-defined]
    assert all(s.startswith("file:") for s in scripts if s), scripts  # nothing fetched from the network
    box = WebDriverWait(browser, 30).until(  # type: ignore[arg-type]
        lambda d: next((e for e in d.find_elements(By.CSS_SELECTOR, "input[data-md-component='search-query']")
                        if e.is_displayed()), None))
    box.click()
    box.send_keys("transactional.id")
    WebDriverWait(browser, 30).until(  # type: ignore[arg-type]
        lambda d: "Kafka in and out" in d.find_element(By.CSS_SELECTOR, ".md-search-result").text)
