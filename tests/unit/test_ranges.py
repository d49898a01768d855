"""Txid ranges and shadow-audit rounds as people give them: one parser each, every bad text refused
the same way wherever it is given -- never a traceback, never read as something else."""

from __future__ import annotations

import pytest

from airflow_transactional.airflow.dag_checks import check_verify
from airflow_transactional.exceptions import ConfigError
from airflow_transactional.ranges import MAX_ID, Round, txid_range

pytestmark = pytest.mark.unit

HUGE = "9" * 5000  # past Python's 4,300-digit limit for int(): a ValueError before, not a ConfigError


@pytest.mark.parametrize("given", ["10:", ":5", "10:0", "0", "-3", "1e3", "10:5:2", " 10", HUGE, f"{HUGE}:1",
                                   "10000000000", 10, 1.5])
def test_a_round_that_is_not_n_or_n_k_is_refused_everywhere_alike(given: object) -> None:
    """Regression: ``"10:"`` was read as ``"10"``; a 5,000-digit N raised a raw ValueError."""
    with pytest.raises(ConfigError, match=r"is a round of the shadow audit, \"N\" or \"N:K\""):
        Round.parse(given)
    with pytest.raises(ConfigError, match="verify is a round of the shadow audit"):
        check_verify(given, None, 0)


def test_a_round_reads_as_it_was_written() -> None:
    assert Round.parse("10") == (10, 1) and Round.parse("10:5") == (10, 5) and str(Round.parse("10:5")) == "10:5"
    assert str(Round(7)) == "7"


@pytest.mark.parametrize("given", [HUGE, f"1..{HUGE}", str(MAX_ID + 1), "0..3", [1, 2**70], [0, 1], "3..", "a..b",
                                   {"txids": HUGE}])
def test_a_txid_range_past_what_the_store_holds_is_refused_naming_the_form(given: object) -> None:
    """Regression: a 5,000-digit txid was a 500 on the correction page and a traceback in the CLI."""
    with pytest.raises(ConfigError, match=r"committed txids as 'A\.\.B' .* each a whole number from 1 to "
                                          r"9,223,372,036,854,775,807; got "):
        txid_range(given)


def test_a_long_refused_value_is_quoted_cut_short() -> None:
    with pytest.raises(ConfigError) as refused:
        txid_range(HUGE)
    assert len(str(refused.value)) < 300 and "(5,002 characters)" in str(refused.value)


def test_txid_ranges_read_as_written() -> None:
    assert txid_range("3..7") == (3, 7) and txid_range(" 4 ") == (4, 4) and txid_range([2, 5]) == (2, 5)
    assert txid_range({"txids": "1-2"}) == (1, 2) and txid_range(str(MAX_ID)) == (MAX_ID, MAX_ID)
