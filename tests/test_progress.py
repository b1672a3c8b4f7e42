"""Progress with a rate and the time left, redrawn while a long step runs: read from the
columns the live display is built with, on a clock the test moves (no waiting)."""

from __future__ import annotations

import json

import pandas as pd
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


def test_before_the_first_item_the_runs_estimate_counts_down():
    """Five steps estimated at 300 s: 60 s in, nothing done yet, the bar says ~4 min left
    and ~60 s an item (marked as the estimate's); once the first is done, the run's own."""
    now = [0.0]
    live = pg.live_progress(console=Console(width=120), get_time=lambda: now[0])
    task_id = live.add_task("phases", total=5, expected_s=300.0)
    task = live.tasks[0]
    now[0] = 60.0
    assert pg.LeftColumn().render(task).plain == "~0:04:00 left"
    assert pg.RateColumn().render(task).plain == "~60.0 s/it"
    now[0] = 400.0  # past the estimate, still nothing done: no time left said (it read
    assert pg.LeftColumn().render(task).plain == "past its estimate"  # 0:00:00 for minutes)
    live.advance(task_id)  # one item in 400 s: 1,600 s for the four left
    assert pg.LeftColumn().render(task).plain == "0:26:40 left"
    assert pg.RateColumn().render(task).plain == "400.0 s/it"
    log = pg._Log("phases", 5, expected_s=300.0)
    assert log.text(60.0) == "phases: 0/5 done, 60 s, about 4 min left (estimated)"
    assert log.text(400.0) == "phases: 0/5 done, 400 s, past the 5 min estimated"
    log.done = 1
    assert log.text(400.0) == "phases: 1/5 done, 400 s, 400.0 s/it, about 27 min left"


def test_phases_hands_its_estimate_to_the_progress(monkeypatch, tmp_path):
    """The estimate priced the same steps the bar counts: it reaches the task."""
    from typer.testing import CliRunner

    from benchbatch.app.cli import app

    seen = []
    real = pg.Progress.task.__func__

    def spy(cls, label, total, quiet=False, expected_s=None):
        seen.append((label, total, expected_s))
        return real(cls, label, total, quiet, expected_s)

    monkeypatch.setattr(pg.Progress, "task", classmethod(spy))
    out = tmp_path / "p"
    args = ["phases", "--preset", "tiny", "--device", "cpu", "--repeats", "1", "--min-time",
            "0", "--prefill", "16", "--decode-batch", "1,2", "--context", "8", "--no-roofline",
            "--out", str(out)]  # fmt: skip
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    meta = json.loads((out / "metadata.json").read_text())
    (phases,) = [s for s in seen if s[0] == "phases"]
    assert phases == ("phases", meta["estimate"]["steps"], meta["estimate"]["estimated_s"])
    assert phases[1] == len(pd.read_csv(out / "phases.csv"))


def test_a_log_line_every_ten_seconds_whether_or_not_an_item_ended(capsys):
    """In a log (no terminal) a step of minutes still shows its time going by: the thread's
    wake prints a line once LOG_EVERY_S passed since the last, never sooner."""
    log = pg._Log("phases", 5, expected_s=300.0)
    log.start = log.last = 1000.0
    assert not log.tick(1000.0 + pg.LOG_EVERY_S - 0.5)
    assert log.tick(1000.0 + pg.LOG_EVERY_S)
    assert not log.tick(1000.0 + pg.LOG_EVERY_S + 1)  # counted from that line
    said = "phases: 0/5 done, 10 s, about 5 min left (estimated)"
    assert capsys.readouterr().err.split() == said.split()


def test_the_heartbeat_thread_ticks_and_stops_with_its_task(monkeypatch):
    """The thread wakes and ticks while the task is open and is gone once it closes (a
    short wake for the test; the wait below only guards against a hang)."""
    import threading

    ticked = threading.Event()
    monkeypatch.setattr(pg, "LOG_EVERY_S", 0.01)
    log = pg._Log("sweep", 3)
    monkeypatch.setattr(log, "tick", lambda now: ticked.set() or False)
    with log.heartbeat():
        assert any(t.name == "progress-log" for t in threading.enumerate())
        assert ticked.wait(timeout=900)
    assert not any(t.name == "progress-log" for t in threading.enumerate())


def test_a_task_logged_to_a_file_keeps_its_heartbeat_open_while_it_runs():
    import threading

    from benchbatch.output.render import err_console

    assert not err_console.is_terminal  # pytest captures stderr: the log mode
    with pg.Progress.task("phases", 3) as task:
        assert any(t.name == "progress-log" for t in threading.enumerate())
        task.advance()
    assert not any(t.name == "progress-log" for t in threading.enumerate())


@pytest.mark.parametrize("terminal", [True, False])
def test_json_keeps_the_progress_for_a_terminal(monkeypatch, tmp_path, terminal):
    """--json turned the progress and the estimate off even with a person at the terminal
    (30 s of nothing): they stay on stderr there, apart from stdout's JSON; a script's
    stderr (no terminal) gets neither."""
    from typer.testing import CliRunner

    from benchbatch.app.cli import app
    from benchbatch.output import render

    monkeypatch.setattr(type(render.err_console), "is_terminal",
                        property(lambda self: terminal))  # fmt: skip
    seen = []
    real = pg.Progress.task.__func__

    def spy(cls, label, total, quiet=False, expected_s=None):
        seen.append(quiet)
        return real(cls, label, total, True, expected_s)  # drawn nowhere in the test

    monkeypatch.setattr(pg.Progress, "task", classmethod(spy))
    args = ["phases", "--preset", "tiny", "--device", "cpu", "--repeats", "1", "--min-time",
            "0", "--prefill", "16", "--decode-batch", "1", "--context", "8", "--no-roofline",
            "--json", "--out", str(tmp_path / "p")]  # fmt: skip
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["rows"]
    assert seen and all(q is (not terminal) for q in seen)
