"""The Transactions views as a person uses them: headless Chromium (Debian's, driven by
Selenium) signs in to the real api-server through Airflow's login page, opens Browse >
Transactions, the words DAG's Transactions tab and a run's Transaction tab, checks the numbers
shown against Postgres, filters and opens a quarantined record, and saves screenshots -- the ones
docs/guides/ui.md shows (docs/ui-*.png). Reads the words topology ``test_transactional_dags.py`` committed."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import quote

import pytest

from airflow_transactional.coordinator import Coordinator
from dev.localstack import LocalStack
from tests.e2e.browsing import WAIT, frame_text, shot, signed_in
from tests.helpers import query

pytestmark = pytest.mark.e2e

def test_a_person_follows_a_topology_from_the_transactions_view(stack: LocalStack, chrome: object,
                                                                tmp_path: Path) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    driver: object = signed_in(chrome, stack)
    wait = WebDriverWait(driver, WAIT)  # type: ignore[arg-type]
    driver.get(f"{stack.url}/plugin/transactions")  # type: ignore[attr-defined]

    coord = Coordinator(stack.state_dsn)
    status = coord.status("words")
    text = frame_text(driver, "words")
    row = next(line for line in text.splitlines() if line.startswith("words "))
    assert row.split()[1] == str(status.committed_txid), row  # the committed txid column
    assert f"{status.quarantined:,}" in row and "nothing" in row  # quarantined, blocked by nothing
    shot(driver, "ui-transactions.png", tmp_path)

    # The DAG's Transactions tab: the timeline and the transactions with what each committed.
    driver.get(f"{stack.url}/dags/words/plugin/transactions-dag")  # type: ignore[attr-defined]
    text = frame_text(driver, "Timeline")
    assert f"Committed txid {status.committed_txid}," in text
    bars = driver.find_elements(By.CSS_SELECTOR, "svg rect")  # type: ignore[attr-defined]
    [(attempts,)] = query(stack.state_dsn, "SELECT count(*) FROM airflow_txn.attempts WHERE topology_id = 'words' "
                                           "AND txid > %s", (status.committed_txid - 30,))
    assert len(bars) == 2 * min(30, status.committed_txid) + attempts  # a plan and a commit per txid, each attempt
    shot(driver, "ui-topology.png", tmp_path)

    # A run whose batch held bad records: its Transaction tab, filtered to one reason.
    [(txid,)] = query(stack.state_dsn, "SELECT DISTINCT txid FROM airflow_txn.quarantine "
                                       "WHERE topology_id = 'words' AND record LIKE '%<script>%'")
    run_id = coord.transaction("words", txid).run_key
    reasons = dict(query(stack.state_dsn, "SELECT reason, count(*) FROM airflow_txn.quarantine "
                                          "WHERE topology_id = 'words' AND txid = %s GROUP BY reason", (txid,)))
    driver.get(f"{stack.url}/dags/words/runs/{quote(run_id, safe='')}/plugin/transactions-run")  # type: ignore[attr-defined]
    text = frame_text(driver, f"txid {txid}")
    assert "Committed at" in text and "Quarantined records" in text
    records = driver.find_elements(By.CSS_SELECTOR, "table:last-of-type tbody tr")  # type: ignore[attr-defined]
    assert len(records) == sum(reasons.values())
    markup = next(r for r in records if "<script>" in r.text)  # shown as text, never run
    assert "<script>alert('txn')</script>" in markup.text
    reason = min(reasons, key=lambda r: (reasons[r], r))
    select = driver.find_element(By.NAME, "reason")  # type: ignore[attr-defined]
    next(o for o in select.find_elements(By.TAG_NAME, "option") if o.get_attribute("value") == reason).click()
    driver.find_element(By.TAG_NAME, "button").click()  # type: ignore[attr-defined]
    wait.until(lambda d: len(d.find_elements(By.CSS_SELECTOR, "table:last-of-type tbody tr")) == reasons[reason])
    assert all(reason in r.text for r in driver.find_elements(By.CSS_SELECTOR, "table:last-of-type tbody tr"))  # type: ignore[attr-defined]
    shot(driver, "ui-run.png", tmp_path)
    coord.close()
