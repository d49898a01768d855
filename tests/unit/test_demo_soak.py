"""The demo soak's verdict on a topology's lag (bench/demo_soak.py), on made-up samples."""

from __future__ import annotations

import pytest

from bench.demo_soak import judge

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(("samples", "verdict"), [
    ([100, 900, 300, 800, 200, 700], "bounded"),        # a saw: every batch catches up
    ([0, 5000, 9000, 400, 300, 200], "bounded"),        # a backlog worked off
    ([100, 200, 300, 400, 500, 600], "grows"),          # every late sample above all earlier ones
    ([100, 5000, 300, 400, 4900, 5200], "bounded"),     # the last third not all above the first two
    ([1, 2], "too short"),
])
def test_a_lag_is_bounded_unless_the_last_third_stays_above_everything_before(samples: list[int],
                                                                           verdict: str) -> None:
    assert judge(samples) == verdict
