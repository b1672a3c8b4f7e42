"""A run folder: its tables, each row on disk as it is added, and its metadata.json, from the
folder's making (`create`, signals held) to its end (complete, failed or interrupted; a run
left open by a signal or an error outside its `with` block is ended by `abandon`). The
machinery around it (progress, ceilings, telemetry, signals) is recorder.py's Recorder."""

from __future__ import annotations

import contextlib
import datetime as dt
import time
from collections.abc import Callable
from pathlib import Path

from benchbatch.core import machine
from benchbatch.errors import UserError, WriteFailed
from benchbatch.output import csv_rows, results
from benchbatch.signals import signals_held


def now_utc() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


# Runs whose metadata.json still says "running": whatever ends the process early (a signal
# between two `with` blocks, an error outside one) finishes them (see abandon), so a run
# folder never stays marked running. The last run made, for the interrupt message.
_OPEN: list[Run] = []
last_run: Run | None = None


class Run:
    """A run folder's tables and metadata; every row reaches the disk as it is added."""

    # A table of many fast rows (the engine's steps) is rewritten at most this often.
    STREAM_INTERVAL_S = 0.5

    def __init__(self, folder: Path, command: str, meta: dict):
        self.folder = folder
        self.tables: dict[str, list[dict]] = {}
        self._streams: dict[str, float] = {}  # table -> time of its last write
        # A stream table -> the rows its file holds and its columns (appended since then).
        self._appended: dict[str, tuple[int, list[str]]] = {}
        self.meta = {
            "schema_version": results.SCHEMA_VERSION,
            "command": command,
            "command_line": results.command_line(),
            "started_utc": now_utc(),
            "status": "running",
            **meta,
        }
        # The run's headline metrics for result.json (the runner sets it: the view's --json
        # document), and what it gave at the run's end (None: nothing, or it failed).
        self.metrics: Callable[[], dict] | None = None
        self.result_metrics: dict | None = None
        self.write_meta()
        _OPEN.append(self)
        global last_run
        last_run = self

    def add(self, table: str, row: dict, stream: bool = False) -> None:
        """Keep one measured row, on disk at once (a stream table: within STREAM_INTERVAL_S,
        appended, and whole when the run ends or is interrupted)."""
        self.tables.setdefault(table, []).append(row)
        if not stream:
            self._write(table)
            return
        last = self._streams.setdefault(table, 0.0)
        if time.monotonic() - last < self.STREAM_INTERVAL_S:
            return
        self._streams[table] = time.monotonic()
        self._append(table)

    def _append(self, table: str) -> None:
        """A stream table's new rows added to the end of its file, or the whole table when
        its columns grew. Rewriting the whole file every half second cost the engine 3-9 ms
        between two steps, more as the table grew, paid by the requests a serving run was
        timing (20 pauses in 337 steps at 5 req/s); an append costs what its rows do, and
        neither touches pandas (output/csv_rows.py). The run's end (flush) writes the
        table whole again."""
        rows = self.tables[table]
        done, columns = self._appended.get(table, (0, None))
        new = rows[done:]
        path = self.folder / f"{table}.csv"
        if columns is None or not {k for r in new for k in r} <= set(columns):
            columns = list(dict.fromkeys(k for r in rows for k in r))
            csv_rows.write_csv_plain(path, rows, columns)
        else:
            csv_rows.append_csv(path, new, columns)
        self._appended[table] = (len(rows), columns)

    def put(self, table: str, rows) -> None:
        """A whole table at once (rows, or a pandas DataFrame for large tables)."""
        self.tables[table] = rows if hasattr(rows, "to_csv") else list(rows)
        self._write(table)

    def _write(self, table: str) -> None:
        self._appended.pop(table, None)  # the next streamed rows start from the whole file
        results.write_csv(self.folder / f"{table}.csv", self.tables[table])

    def flush(self) -> None:
        """Write every table again: a row kept in memory whose write was cut short (by
        Ctrl-C, say) reaches the disk too."""
        for table in self.tables:
            self._write(table)

    def rows(self, table: str) -> list[dict]:
        rows = self.tables.get(table, [])
        return rows.to_dict("records") if hasattr(rows, "to_dict") else rows

    def write_meta(self) -> None:
        """metadata.json, with the files the run has written so far (--force later removes
        exactly these)."""
        self.meta["written_files"] = sorted({*results.written_in(self.folder), "metadata.json"})
        results.write_json(self.folder / "metadata.json", self.meta)

    def finish(self, status: str = "complete", **extra) -> None:
        if self in _OPEN:
            _OPEN.remove(self)
        self.meta.update(extra, status=status, finished_utc=now_utc())
        self.meta["load_average_after"] = machine.load_average()
        try:
            self.write_result()
        except BaseException as e:  # a run whose result.json failed did not complete
            if status == "complete":
                self.meta.update(status="failed", error=f"{type(e).__name__}: {e}")
            raise
        finally:  # a result.json that cannot be written never leaves the run marked running
            self._write_meta_after_result()

    def _write_meta_after_result(self) -> None:
        """metadata.json's last write; where it fails (a full disk), a result.json that says
        the run completed is taken back (its space freed for end()'s "failed" to be written):
        no marker says complete of a run that ended in an error."""
        try:
            self.write_meta()
        except BaseException:
            if self.meta.get("status") == "complete":
                (self.folder / results.RESULT_FILE).unlink(missing_ok=True)
                self.meta.update(status="failed")
            raise

    def write_result(self) -> None:
        """result.json (results.write_result) at the run's end, whatever the end: before
        metadata.json's last write, which then lists it. An interrupted run's rows may not
        make its metrics: result.json then says why, with "complete": false."""
        metrics, error = None, None
        if self.metrics is not None:
            try:
                metrics = self.metrics()
            except Exception as e:  # noqa: BLE001
                error = f"{type(e).__name__}: {e}"
        self.result_metrics = metrics
        results.write_result(self.folder, self.meta, metrics, error)

    def end(self, status: str, **extra) -> None:
        """Finish a run that did not complete (interrupted, failed): every row kept in
        memory written, metadata.json marked, half-written files removed. A write that
        fails now (the disk still full) leaves what is on disk: it cannot be helped."""
        with signals_held():
            for step in (self.flush, lambda: self.finish(status, **extra)):
                try:
                    step()
                except WriteFailed:
                    pass
                except Exception:  # noqa: BLE001
                    # A signal that landed inside an import (pandas, say) leaves that module
                    # half-initialised, so writing the rows can fail too: the run still
                    # ends as it must (metadata marked), with what is already on disk.
                    if status == "complete":
                        raise
            if self in _OPEN:
                _OPEN.remove(self)
            results.remove_temporaries(self.folder)


def kept(folder: Path) -> str:
    """What an unfinished run left, as its last line says it: its tables' rows, or that
    none was measured (a command that times its steps as one group of interleaved
    repeats, phases or sweep, writes its rows when the group ends)."""
    counts = []
    for path in sorted(Path(folder).glob("*.csv")):
        try:
            with path.open("rb") as f:
                n = max(0, sum(1 for line in f if line.strip()) - 1)
        except OSError:
            continue
        if n:
            counts.append(f"{path.name} {n:,}")
    if not counts:
        return f"no row was measured yet: {folder} holds the run's metadata only"
    return f"rows measured so far are in {folder} ({', '.join(counts)})"


def abandon(status: str, error: BaseException | None = None) -> list[Path]:
    """End every run still open (a signal or an error outside its `with` block); returns
    their folders."""
    folders = []
    for run in list(_OPEN):
        extra = {"error": f"{type(error).__name__}: {error}"} if error is not None else {}
        run.end(status, **extra)
        folders.append(run.folder)
    return folders


def input_paths(options) -> list[Path]:
    """Every path among a run's options (--trace, --prompts, --ceilings, --step-costs,
    --model, ...): --force never removes one of them from the folder it replaces."""
    found = []

    def walk(value) -> None:
        if isinstance(value, (list, tuple)):
            for v in value:
                walk(v)
        elif isinstance(value, (str, Path)) and str(value) and ("/" in str(value) or
                                                                 Path(value).suffix):  # fmt: skip
            found.append(Path(value))

    for value in (options or {}).values():
        walk(value)
    return found


def create(cls, out: Path | None, force: bool, command: str, meta: dict, *args, **kwargs):
    """cls(folder, command, meta, ...) in a folder made for it, with signals held from the
    folder's mkdir to its metadata.json: Ctrl-C never finds a folder that says nothing. A
    first write that fails means --out cannot be written to (the folder made is removed)."""
    with signals_held():
        existed = out is not None and out.is_dir()
        folder = results.run_dir(out, command, force, keep=input_paths(meta.get("options")))
        try:
            return cls(folder, command, meta, *args, **kwargs)
        except WriteFailed as e:
            if not existed:
                with contextlib.suppress(OSError):
                    results.remove_temporaries(folder)
                    folder.rmdir()
            raise UserError("--out", f"cannot write to {folder}: {e.reason}") from None
