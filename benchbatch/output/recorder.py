"""One run, from its folder to its end: the one recording loop every command goes through.

`Recorder.open` makes the run folder and writes metadata.json at once (so a folder never
exists without saying what it holds); `record` consumes a probe's rows generator and, for
each row as it comes, adds the columns every timed row carries (`throttled`, and mfu, mbu
and bound against the run's one set of ceilings), writes it to its CSV and advances the
progress display. Leaving the `with` block finishes metadata.json: complete, failed, or
interrupted (Ctrl-C or SIGTERM: every measured row is on disk, then `Interrupted` is raised
for the command line to exit with code 130). The folder itself (its tables, metadata.json,
`create`, `abandon`) is run_folder.py's Run.
"""

from __future__ import annotations

import contextlib
import os
import platform
import signal
import sys
import threading
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from benchbatch import __version__
from benchbatch.core import machine
from benchbatch.core.ranks import is_writer
from benchbatch.core.units import figure
from benchbatch.errors import Interrupted, WriteFailed
from benchbatch.output import render, results
from benchbatch.output.progress import Progress
from benchbatch.output.run_folder import Run, create
from benchbatch.signals import ENDING, ending, signals_held


def environment(target=None) -> dict:
    """What a reader needs to trust or compare the numbers: software, machine, device. A
    run that uses no device (a simulation) records the machine without importing torch."""
    out = {
        "benchbatch_version": __version__,
        "git_commit": results.git_commit(),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "torch_version": machine.version("torch"),
        "cpu": {"model": machine.cpu_model(), "logical_cpus": os.cpu_count()},
        "load_average": machine.load_average(),
    }
    if target is None:
        return out
    import torch

    from benchbatch.runtime import device

    return out | {
        "torch_cuda": torch.version.cuda,
        "device": str(target.device),
        "device_name": device.device_name(target.device),
        "dtype": target.dtype_name,
        "cpu": device.cpu_info(),
    }


class Recorder(Run):
    """A Run with the machinery around it: signals, progress, throttle watch, ceilings."""

    def __init__(self, folder: Path, command: str, meta: dict, target=None, quiet=False,
                 cfg=None, given_ceilings=None):  # fmt: skip
        if target is not None and meta.get("telemetry_before") is None:
            from benchbatch.runtime import telemetry

            meta = {**meta, "telemetry_before": telemetry.snapshot(target.device)}
        super().__init__(folder, command, meta)
        self.target = target
        self.quiet = quiet
        self.cfg = cfg  # the model's shape (None: a run that builds no model)
        self.given_ceilings = given_ceilings  # --ceilings, read and checked before the folder
        self.ceilings = None  # the run's one set of ceilings, once known (use_ceilings)
        # What the experiment's open_run checked, for its measure_run to run on (the requests
        # as served, a fitted cost): kept in memory, never written.
        self.inputs: object = None
        self.later: list[str] = []  # warnings about finished tables, said under them (view)
        self._watch = None
        self._group_look: tuple[int, object] | None = None  # (timing_group, its look)
        self._stack = contextlib.ExitStack()

    @classmethod
    def open(cls, command: str, run, target, cfg, options: dict, given_ceilings=None) -> Recorder:
        """The run folder (--out, or a new one) and its first metadata.json, made together
        (signals held): a folder never exists without saying what it holds."""
        if run.out is not None and is_writer():  # rank 0's folder: the others neither
            # check nor make it (rank 0 may have made it already, under torchrun)
            results.check_out(run.out, command, run.force)
        meta = {
            "config": cfg.to_dict() if cfg is not None else None,
            "options": options,
            "environment": environment(target),
            "telemetry_before": None,
        }
        if target is not None:  # slow (NVML): before the folder exists
            from benchbatch.runtime import telemetry

            meta["telemetry_before"] = telemetry.snapshot(target.device)
        # --json for a script: no progress or estimate on stderr; a person at a terminal
        # (stdout piped to a file, say) still sees them, on stderr, apart from the JSON
        quiet = run.json_out and not render.err_console.is_terminal
        return create(cls, run.out, run.force, command, meta, target, quiet=quiet,
                      cfg=cfg, given_ceilings=given_ceilings)  # fmt: skip

    def use_ceilings(self, ceilings) -> None:
        """The run's one set of ceilings from here on (None: no roofline), in metadata.json
        too: every row recorded afterwards is placed against them."""
        self.ceilings = ceilings
        if ceilings is not None:
            self.meta["ceilings"] = ceilings.to_dict()

    # --- the run's lifetime ---------------------------------------------------------------

    def __enter__(self) -> Recorder:
        self._stack.enter_context(interrupts_raise())
        if self.target is not None:
            from benchbatch.runtime import telemetry

            self._watch = self._stack.enter_context(telemetry.ThrottleWatch(self.target.device))
        return self

    def __exit__(self, kind, error, tb) -> bool:
        try:
            if error is None:
                try:
                    with signals_held():
                        self.flush()
                        self.finish("complete", telemetry_after=self._telemetry())
                except WriteFailed as e:  # the last rows do not fit on the disk
                    self.end("failed", error=f"{type(e).__name__}: {e}")
                    raise
            elif isinstance(error, KeyboardInterrupt):
                with signals_held():  # a second Ctrl-C waits for the last writes
                    self.end("interrupted", telemetry_after=self._telemetry())
                raise Interrupted(self.folder) from None
            else:
                self.end("failed", error=f"{type(error).__name__}: {error}")
        finally:
            self._stack.close()
        return False

    def _telemetry(self) -> dict | None:
        if self.target is None:
            return None
        from benchbatch.runtime import telemetry

        return telemetry.snapshot(self.target.device)

    # --- rows -----------------------------------------------------------------------------

    def record(
        self,
        table: str,
        rows: Iterable[dict],
        *,
        total: int | None = None,
        label: str | None = None,
        timed: bool = True,
        stream: bool = False,
        expected_s: float | None = None,
    ) -> list[dict]:
        """Consume a rows generator: each row gets the shared columns, reaches its CSV and
        advances the progress display (expected_s: the run's estimate of all `total` rows,
        counted down until the first is done). Returns every row of the table."""
        with self.progress(label or table, total, expected_s) as task:
            for row in rows:
                self.add(table, self.columns(row) if timed else row, stream=stream)
                task.advance()
        return self.rows(table)

    def engine_rows(
        self, table: str, events: Iterable, *, total: int | None = None, label: str | None = None
    ) -> Iterator:
        """Consume the real engine's events (benchbatch/runtime/runs.py): each step's row
        into `table` as it ends (streamed), and every other event (a run's Finished) handed
        back to the caller, in order, for its summary row."""
        with self.progress(label or table, total) as task:
            for event in events:
                if isinstance(event, dict):
                    self.add(table, self.columns(event), stream=True)
                    task.advance()
                else:
                    yield event

    def note(self, text: str | None) -> None:
        """A note for the user, on stderr now (rank 0 only): what an experiment says while
        it runs goes through its run, never printed by the experiment itself."""
        if text:
            render.note(text)

    def warning(self, text: str | None, later: bool = False) -> None:
        """A warning on stderr now, and kept (metadata.json's and result.json's "warnings"):
        what makes a number less sure outlives the terminal it was said on. later: one
        about a finished table, kept now and said under it (the view prints `later`)."""
        if text:
            kept = self.meta.setdefault("warnings", [])
            if later:
                self.later.append(text)
            else:
                render.warning(text)
            if text not in kept:
                kept.append(text)

    def say(self, text: str | None) -> None:
        """A line for the user on stderr now, exactly as given, unlabelled (rank 0 only):
        what a run is about to do, e.g. its estimated duration."""
        if text:
            render.err_console.print(text, highlight=False)

    def columns(self, row: dict) -> dict:
        """throttled (the GPU slowed its clocks while the row was measured) and, against the
        run's ceilings, mfu, mbu and bound."""
        from benchbatch.core.roofline import annotate, raised

        measured = row.get("status", "ok") == "ok"
        look = self._look(row.get("timing_group"))
        row = {
            **row,
            "throttled": bool(look and look.throttled) and measured,
            "power_capped": bool(look and look.power_capped) and measured,
        }
        if self.ceilings is not None and "arithmetic_intensity" in row:
            higher = raised(self.ceilings, row)
            if higher is not None:
                self.raise_ceilings(higher, row)
            row = annotate(row, self.ceilings)
        return row

    def raise_ceilings(self, higher, row: dict) -> None:
        """A row beat the run's ceilings: they become what it reached, for every row of
        the run (those already recorded are placed again, so one set of ceilings holds
        everywhere), and the run says so (metadata, and a note)."""
        from benchbatch.core.roofline import annotate
        from benchbatch.output import render

        before, self.ceilings = self.ceilings, higher
        self.meta["ceilings"] = {**higher.to_dict(), "source": self.meta.get("ceilings_source")}
        for name, old, new, unit in (
            ("matmul", before.peak_tflops, higher.peak_tflops, "TFLOP/s"),
            ("memory", before.peak_gbps, higher.peak_gbps, "GB/s"),
        ):
            if new == old:
                continue
            change = {"ceiling": name, "unit": unit, "from": old, "to": new, "by": row.get("label")}
            self.meta.setdefault("ceilings_raised", []).append(change)
            if not self.quiet:
                render.note(
                    f"{row.get('label')} reached {figure(new)} {unit}, over the probe's {name} "
                    f"ceiling of {figure(old)}: the ceiling is raised to it for every row of "
                    "this run"
                )
        for table, rows in self.tables.items():
            if isinstance(rows, list) and rows and "bound" in rows[0]:
                self.tables[table] = [annotate(r, higher) for r in rows]
                self._write(table)
        self.write_meta()

    def _look(self, group):
        """One look at the GPU per row; rows timed together as a group (their repeats
        interleaved) were measured over the same stretch of time: one look serves them all."""
        if self._watch is None:
            return None
        if group is not None and self._group_look and self._group_look[0] == group:
            return self._group_look[1]
        look = self._watch.look()
        self._group_look = (group, look) if group is not None else None
        return look

    def progress(self, label: str, total: int | None, expected_s: float | None = None):
        return Progress.task(label, total, quiet=self.quiet, expected_s=expected_s)

    def untrusted(self, table: str, name: Callable[[dict], str]) -> dict[str, list[str]]:
        """Rows whose times are hard to trust, by name: noisy and throttled."""
        rows = self.rows(table)
        return {flag: [name(r) for r in rows if r.get(flag) is True] for flag in NOT_TRUSTED}


NOT_TRUSTED = ("noisy", "throttled", "power_capped")


# --- signals -----------------------------------------------------------------------------


def _in_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


@contextlib.contextmanager
def interrupts_raise():
    """SIGTERM (a scheduler's kill, `timeout`) and SIGHUP (the terminal closed; not one
    ignored since the start, nohup) raise KeyboardInterrupt, as Ctrl-C does."""
    if not _in_main_thread():
        yield
        return
    previous = {sig: ending(sig) for sig in ENDING}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)
