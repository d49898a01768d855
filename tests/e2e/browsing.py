"""Headless Chromium (Debian's, driven by Selenium) for the e2e tests that look at the Transactions
views as a person does: signed in through Airflow's login page, the plugin's pages read in the UI's
frame, and screenshots saved where the docs take them from (docs/ui-*.png)."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

from dev.localstack import ADMIN, LocalStack

CHROMIUM, DRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
DOCS = Path(__file__).resolve().parents[2] / "docs"
WAIT = 60


def chromium() -> Iterator[object]:
    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    missing = [p for p in (CHROMIUM, DRIVER) if not os.path.exists(p)]
    assert not missing, (f"{missing} missing: install Debian's chromium and chromium-driver "
                         "(make test does when it runs as root)")
    options = Options()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1440,1000",
                "--disable-gpu"):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service(DRIVER), options=options)
    driver.set_page_load_timeout(WAIT)
    yield driver
    driver.quit()


def frame_text(driver: object, expect: str) -> str:
    """The text of the plugin page in the UI's frame, once it shows ``expect``."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    wait = WebDriverWait(driver, WAIT)  # type: ignore[arg-type]
    driver.switch_to.default_content()  # type: ignore[attr-defined]
    wait.until(ec.frame_to_be_available_and_switch_to_it((By.CSS_SELECTOR, "iframe")))
    wait.until(lambda d: expect in d.find_element(By.TAG_NAME, "body").text)
    return str(driver.find_element(By.TAG_NAME, "body").text)  # type: ignore[attr-defined]


def shot(driver: object, name: str, tmp: Path) -> None:
    driver.switch_to.default_content()  # type: ignore[attr-defined]
    path = tmp / name
    assert driver.save_screenshot(str(path))  # type: ignore[attr-defined]
    DOCS.mkdir(exist_ok=True)
    shutil.copy(path, DOCS / name)  # what docs/guides/ui.md shows


def signed_in(driver: object, stack: LocalStack) -> object:
    """``driver`` signed in on Airflow's own login page (once per browser), as a person would."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.support.ui import WebDriverWait

    if getattr(driver, "_txn_signed_in", None) == stack.url:
        return driver
    wait = WebDriverWait(driver, WAIT)  # type: ignore[arg-type]
    driver.get(f"{stack.url}/plugin/transactions")  # type: ignore[attr-defined]
    user = wait.until(lambda d: d.find_element(By.NAME, "username"))
    user.send_keys(ADMIN)
    password = driver.find_element(By.NAME, "password")  # type: ignore[attr-defined]
    password.send_keys(stack.admin_password, Keys.ENTER)
    wait.until(lambda d: "/auth/" not in d.current_url)
    driver._txn_signed_in = stack.url  # type: ignore[attr-defined]
    return driver
