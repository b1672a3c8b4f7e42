"""Progress with a rate and the time left, redrawn while a long step runs: read from the
columns the live display is built with, on a clock the test moves (no waiting)."""

from __future__ import annotations

import pytest
from rich import progress as rp
from rich.console import Console

from benchbatch.output import progress as pg


def test_the_live_bar_has_a_spinner_elapsed_rate_and_time_left_and_redraws_itself():
    live = pg.live_progress(console=Console(width=120, force_terminal=False))
    kinds = [type(c) for c in live.columns]
    assert kinds[0] is rp.SpinnerColumn  # turns while a step runs
    for kind in (rp.BarColumn, rp.MofNCompleteColumn, rp.TimeElapsedColumn, pg.RateColumn):
        assert kind in kinds, kind
    assert any(issubclass(k, rp.TimeRemainingColumn) for k in kinds)
    # rich's own thread redraws it, at least every few seconds, whether or not an item ends
    assert live.live.auto_refresh and live.live.refresh_per_second >= 0.5


def test_rate_and_time_left_from_the_first_item_on():
    """Five steps of 120 s: nothing to say before the first ends, then 120 s per item and
    8 minutes left (rich's own estimate would need a second item within its window)."""
    now = [0.0]
    live = pg.live_progress(console=Console(width=120), get_time=lambda: now[0])
    task_id = live.add_task("phases", total=5)
    task = live.tasks[0]
    now[0] = 100.0
    assert pg.RateColumn().render(task).plain == ""
    assert pg.LeftColumn().render(task).plain == "-:--:-- left"
    assert "0:01:40" in rp.TimeElapsedColumn().render(task).plain  # ticking meanwhile
    now[0] = 120.0
    live.advance(task_id)
    assert task.time_remaining is None  # why the column does not take rich's speed
    assert pg.RateColumn().render(task).plain == "120.0 s/it"
    assert pg.LeftColumn().render(task).plain == "0:08:00 left"
    now[0] = 122.0
    live.advance(task_id, 3)  # fast ones now: the average since the start
    assert pg.RateColumn().render(task).plain == "30.5 s/it"  # 4 items in 122 s
    assert pg.LeftColumn().render(task).plain == "0:00:30 left"  # 1 item at 30.5 s each


@pytest.mark.parametrize(
    ("done", "total", "elapsed", "rate", "left"),
    [(0, 5, 60.0, "", None), (1, 5, 120.0, "120.0 s/it", 480.0), (50, 100, 10.0, "5.0 it/s", 10.0),
     (3, None, 3.0, "1.0 it/s", None), (5, 5, 10.0, "2.0 s/it", 0.0)],
)  # fmt: skip
def test_rate_text_and_time_left(done, total, elapsed, rate, left):
    assert pg.rate_text(pg.average_rate(done, elapsed)) == rate
    assert pg.left_s(done, total, elapsed) == left


def test_log_lines_say_the_rate_and_time_left():
    log = pg._Log("sweep", 8)
    log.done = 2
    assert log.text(30.0) == "sweep: 2/8 done, 30 s, 15.0 s/it, about 2 min left"
    log.done = 8
    assert log.text(120.0, end=True) == "sweep: 8/8 finished, 120 s, 15.0 s/it"
    assert pg._Log("x", None).text(5.0) == "x: 0 done, 5 s"
    log = pg._Log("x", None)
    log.done = 3
    assert log.text(6.0) == "x: 3 done, 6 s, 2.0 s/it"  # no total: no time left


def test_a_count_past_its_estimated_total_is_never_shown_as_more_than_the_total():
    """A real engine's total steps come from its simulation: when the engine takes more, the
    log says so and the bar's total follows the count (never 3,996/3,722)."""
    log = pg._Log("real engine", 3722)
    log.done = 3996
    assert log.text(121.0, end=True) == (
        "real engine: 3,996 finished, 121 s (more than the 3,722 estimated), 33.0 it/s"
    )
    live = pg.live_progress(console=Console(width=120), get_time=lambda: 1.0)
    bar = pg._Bar(live, "real engine", 3)
    for _ in range(5):
        bar.advance()
    (task,) = live.tasks
    assert task.completed == 5 and task.total == 5
