"""A run in progress: its folder, rows written as they are measured, and its metadata.

Rows reach the disk one by one (each CSV rewritten whole under a temporary name), so an
interrupted run keeps everything it measured, and metadata.json says how the run ended.
"""

from __future__ import annotations

import datetime as dt
import platform
import sys
from pathlib import Path

import torch

from benchbatch import __version__, device, results


def now_utc() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


def environment(target: device.Target) -> dict:
    """What a reader needs to trust or compare the numbers: software, machine, device."""
    return {
        "benchbatch_version": __version__,
        "git_commit": results.git_commit(),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "torch_version": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "device": str(target.device),
        "device_name": device.device_name(target.device),
        "dtype": target.dtype_name,
        "cpu": device.cpu_info(),
    }


class Run:
    def __init__(self, folder: Path, command: str, meta: dict):
        self.folder = folder
        self.tables: dict[str, list[dict]] = {}
        self.meta = {
            "schema_version": results.SCHEMA_VERSION,
            "command": command,
            "command_line": results.command_line(),
            "started_utc": now_utc(),
            "status": "running",
            **meta,
        }
        self.write_meta()

    def add(self, table: str, row: dict) -> None:
        """Keep one measured row, on disk at once."""
        self.tables.setdefault(table, []).append(row)
        results.write_csv(self.folder / f"{table}.csv", self.tables[table])

    def put(self, table: str, rows: list[dict]) -> None:
        self.tables[table] = list(rows)
        results.write_csv(self.folder / f"{table}.csv", self.tables[table])

    def flush(self) -> None:
        """Write every table again: a row kept in memory whose write was cut short (by
        Ctrl-C, say) reaches the disk too."""
        for table, rows in self.tables.items():
            results.write_csv(self.folder / f"{table}.csv", rows)

    def rows(self, table: str) -> list[dict]:
        return self.tables.get(table, [])

    def write_meta(self) -> None:
        results.write_json(self.folder / "metadata.json", self.meta)

    def finish(self, status: str = "complete", **extra) -> None:
        self.meta.update(extra, status=status, finished_utc=now_utc())
        self.write_meta()
