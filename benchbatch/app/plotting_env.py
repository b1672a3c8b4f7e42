"""matplotlib's environment, set before matplotlib is imported (benchbatch/app/cli.py
imports this first): a stable config folder where the home is read-only, and Agg where
MPLBACKEND names no backend matplotlib has."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def matplotlib_config_dir() -> None:
    """With a read-only home, matplotlib warns and rebuilds its font cache in a new temporary
    folder on every run: give it one stable folder instead (before it is imported)."""
    if os.environ.get("MPLCONFIGDIR"):
        return
    try:
        home = Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config")
        (home / "matplotlib").mkdir(parents=True, exist_ok=True)
        if os.access(home / "matplotlib", os.W_OK):
            return
    except (OSError, RuntimeError):
        pass
    user = os.getuid() if hasattr(os, "getuid") else "user"
    fallback = Path(tempfile.gettempdir()) / f"benchbatch-matplotlib-{user}"
    try:
        fallback.mkdir(mode=0o700, exist_ok=True)
        mine = not hasattr(os, "getuid") or fallback.stat().st_uid == os.getuid()
    except OSError:
        return  # matplotlib makes its own temporary folder
    if mine and os.access(fallback, os.W_OK):  # not a folder another user left in /tmp
        os.environ["MPLCONFIGDIR"] = str(fallback)


matplotlib_config_dir()

# matplotlib's own backends (and module://NAME, a third party's). benchbatch draws every
# figure with Agg whatever MPLBACKEND says, but matplotlib refuses an unknown name at its
# import: the whole measurement would run, then its first figure fail.
MPL_BACKENDS = frozenset(
    "gtk3agg gtk3cairo gtk4agg gtk4cairo macosx nbagg notebook qtagg qtcairo qt5agg qt5cairo "
    "tkagg tkcairo webagg wx wxagg wxcairo agg cairo pdf pgf ps svg template inline".split()
)


def matplotlib_backend() -> str | None:
    """An MPLBACKEND matplotlib would refuse is replaced by Agg before matplotlib is
    imported; returns the one line saying so (None: nothing to say)."""
    given = os.environ.get("MPLBACKEND")
    if not given or given.lower() in MPL_BACKENDS or given.lower().startswith("module://"):
        return None
    os.environ["MPLBACKEND"] = "agg"
    return f"note: MPLBACKEND={given!r} is no matplotlib backend; figures are drawn with Agg"


BACKEND_NOTE = matplotlib_backend()
