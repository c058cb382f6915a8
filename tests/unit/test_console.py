"""Issue 38 item 6: the console's pace on a slow model and little data is a number, not '0 tok/s'."""

import io

import pytest

from trajtune.metrics import Console, speed


@pytest.mark.parametrize("tokens, seconds, steps, shown", [
    (8120.0, 10.0, 10, "812 tok/s"), (12_345.0, 1.0, 1, "12,345 tok/s"), (34.0, 10.0, 2, "3.4 tok/s"),
    (4.0, 9.8, 2, "0.41 tok/s"), (1.0, 400.0, 1, "0.0025 tok/s"),
    (0.0, 24.6, 2, "12.3 s/step"), (0.0, 0.09, 2, "45 ms/step"), (0.0, 0.0011, 1, "1.1 ms/step")])
def test_the_pace_has_the_digits_it_needs(tokens, seconds, steps, shown):
    assert speed(tokens, seconds, steps) == shown


def test_a_slow_sft_line_shows_its_tokens_per_second(monkeypatch):
    """Two SFT steps of 3 trained tokens in 14 s: 0.43 tok/s (the line printed '0 tok/s')."""
    now = [100.0]
    monkeypatch.setattr("trajtune.metrics.time.perf_counter", lambda: now[0])
    out = io.StringIO()
    c = Console("sft", every=1, total=4, stream=out)
    c.start(0, 4)
    for step in (1, 2):
        now[0] += 7.0
        c.update(step, {"train/loss": 2.5, "train/tokens": 3.0})
    first, second = out.getvalue().splitlines()
    assert "0.43 tok/s" in first and "0.43 tok/s" in second and "0 tok/s" not in out.getvalue()
    assert "eta 14s" in second  # 7 s a step, 2 steps left
