"""Which process this is among the ranks torchrun started, read from torchrun's environment
alone (no torch, no process group): rank 0 writes files and prints, and --tp is checked
against the ranks there are before anything runs. benchbatch/runtime/distributed.py joins
the ranks into a process group."""

from __future__ import annotations

import os

from benchbatch.errors import UserError

ENVIRONMENT = ("RANK", "WORLD_SIZE", "LOCAL_RANK")
LAUNCH = "torchrun --nproc-per-node N -m benchbatch"
TORCHRUN = "torchrun environment"  # what its errors name (no option of a command)


def launched() -> bool:
    """Started by torchrun (or anything that sets its environment)."""
    return all(name in os.environ for name in ENVIRONMENT)


def env_int(name: str) -> int:
    try:
        return int(os.environ[name])
    except (KeyError, ValueError):
        return 0


def rank() -> int:
    return env_int("RANK") if launched() else 0


def world_size() -> int:
    return max(1, env_int("WORLD_SIZE")) if launched() else 1


def is_writer() -> bool:
    """The one process that writes files and prints: rank 0 (or the only process)."""
    return rank() == 0


def check_environment() -> None:
    """torchrun's variables, when all three are set, are whole numbers that make sense
    together (torch.distributed would raise a ValueError from deep inside otherwise)."""
    if not launched():
        return
    values = {}
    for name in ENVIRONMENT:
        text = os.environ[name].strip()
        if not (text.isascii() and text.isdigit()) or len(text) > 9:
            raise UserError(TORCHRUN, f"{name}={os.environ[name][:40]!r} is not a rank count "
                            "or index (a whole number, as torchrun sets it)")  # fmt: skip
        values[name] = int(text)
    if values["WORLD_SIZE"] < 1 or values["RANK"] >= values["WORLD_SIZE"]:
        raise UserError(
            TORCHRUN,
            f"RANK={values['RANK']} and WORLD_SIZE={values['WORLD_SIZE']} do not fit together "
            "(0 <= RANK < WORLD_SIZE)",
        )


def resolve_tp(tp: int | None) -> int:
    """--tp as it applies: the world size by default; a UserError naming --tp when it cannot
    (the same on every rank, before any process group exists, so no rank waits)."""
    check_environment()
    size = world_size()
    if tp is None:
        return size
    if not launched():
        if tp > 1:
            raise UserError(
                "tp", f"{tp} ranks need torchrun: `{LAUNCH.replace('N', str(tp))} ...` "
                "starts one process per rank"
            )  # fmt: skip
        return 1
    if tp > size:
        raise UserError(
            "tp", f"{tp} is more than the {size} rank(s) torchrun started (--nproc-per-node "
            "times --nnodes)"
        )  # fmt: skip
    if size % tp:
        raise UserError(
            "tp", f"the {size} ranks do not make groups of {tp}: tp must divide the world size"
        )
    return tp
