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


# A rank whose error is not rank 0's waits this long before saying it: every rank checks
# the same options, so rank 0 most often fails the same way meanwhile, says it once, and
# torchrun ends this rank silently; an error rank 0 does not share is said after it.
ERROR_GRACE_S = 10.0


def error_grace_s() -> float:
    """ERROR_GRACE_S, or BENCHBATCH_RANK_ERROR_GRACE_S where set (ranks started by hand,
    with no torchrun to end them, need not wait)."""
    try:
        return max(0.0, float(os.environ["BENCHBATCH_RANK_ERROR_GRACE_S"]))
    except (KeyError, ValueError):
        return ERROR_GRACE_S


# What torch.distributed raises on a rank whose peer left (gloo's errors are RuntimeErrors).
PEER_LOST = ("connection reset by peer", "connection closed by peer", "broken pipe",
             "socket closed", "connection refused")  # fmt: skip


def peer_lost(error: BaseException) -> bool:
    """Under torchrun, a collective that failed because another rank is gone (killed, out of
    memory, exited): torch.distributed's errors, or gloo's RuntimeError naming the lost
    connection."""
    if not launched() or not isinstance(error, RuntimeError):
        return False
    if type(error).__name__ in ("DistBackendError", "DistNetworkError", "DistError"):
        return True
    text = str(error).lower()
    return "gloo" in text and any(p in text for p in PEER_LOST)


def world_size() -> int:
    return max(1, env_int("WORLD_SIZE")) if launched() else 1


def local_world_size() -> int:
    """The ranks on this machine (torchrun's LOCAL_WORLD_SIZE; the world where unset)."""
    if not launched():
        return 1
    return max(1, env_int("LOCAL_WORLD_SIZE") or world_size())


def is_writer() -> bool:
    """The one process that writes files and prints: rank 0 (or the only process)."""
    return rank() == 0


def sensible() -> bool:
    """torchrun's variables, where set, make sense together (check_environment passes)."""
    try:
        check_environment()
    except UserError:
        return False
    return True


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
