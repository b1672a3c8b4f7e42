"""The core that needs no model stays free of torch: the scheduler, the simulator, the
workloads, the metrics, the accounting, the configs and the options import with torch made
unimportable (a subprocess, so this session's torch does not count)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "benchbatch"


def core_modules() -> list[str]:
    """Every module of benchbatch/core (the folder walked, not a list kept by hand), and the
    experiments' options, which are data too."""
    found = [
        p.relative_to(PACKAGE.parent).with_suffix("") for p in (PACKAGE / "core").rglob("*.py")
    ]
    found += [p.relative_to(PACKAGE.parent).with_suffix("")
              for p in (PACKAGE / "experiments").glob("*/options.py")]  # fmt: skip
    return sorted(".".join(p.parts[:-1] if p.name == "__init__" else p.parts) for p in found)


def run_without(blocked: tuple[str, ...], code: str) -> subprocess.CompletedProcess:
    """Run code in a fresh interpreter where importing any of `blocked` fails."""
    guard = textwrap.dedent(
        f"""
        import sys
        class Block:
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] in {blocked!r}:
                    raise ImportError(f"{{name}} is blocked in this test")
        sys.meta_path.insert(0, Block())
        """
    )
    return subprocess.run(
        [sys.executable, "-c", guard + code], capture_output=True, text=True, timeout=900
    )


def test_the_core_imports_and_simulates_without_torch():
    core = core_modules()
    assert "benchbatch.core.scheduler" in core and len(core) > 20
    code = "import importlib\n"
    code += "".join(f"importlib.import_module({m!r})\n" for m in core)
    code += textwrap.dedent(
        """
        from benchbatch.core.options import WorkloadOptions
        from benchbatch.core.simulate import run_policies
        sims = run_policies(WorkloadOptions(requests=600).draw(seed=3), 32)
        print(sims["static"].total_steps, sims["continuous"].total_steps)
        """
    )
    done = run_without(("torch",), code)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["10089", "2576"]


def test_the_guard_really_blocks():
    done = run_without(("torch",), "import benchbatch.runtime.model")
    assert done.returncode != 0 and "torch is blocked" in done.stderr


HEAVY = ("torch", "pandas", "matplotlib", "numpy")


def test_help_and_bad_input_import_no_torch_pandas_or_matplotlib():
    """`benchbatch --help`, a command's --help and a user error start in a fraction of a
    second: nothing heavy is imported before a command needs it."""
    for argv in (
        ["--help"],
        ["phases", "--help"],
        ["phases", "--prefill", "x"],
        ["serve-sweep", "--help"],
        ["serve-sweep", "--rates", "x"],
    ):
        code = f"import sys; sys.argv = ['benchbatch', *{argv!r}]\n"
        code += "from benchbatch.app.cli import main\nmain()\n"
        done = run_without(HEAVY, code)
        assert done.returncode == (2 if "x" in argv else 0), done.stderr
        assert "blocked" not in done.stderr


def test_a_simulation_needs_no_torch(tmp_path):
    code = "import sys; sys.argv = ['benchbatch', 'occupancy', '--requests', '50', "
    code += f"'--out', {str(tmp_path / 'run')!r}]\nfrom benchbatch.app.cli import main\nmain()\n"
    done = run_without(("torch",), code)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "run" / "occupancy.csv").exists()


def test_a_projection_needs_no_torch(tmp_path):
    code = "import sys; sys.argv = ['benchbatch', 'project', '--json', "
    code += f"'--out', {str(tmp_path / 'run')!r}]\nfrom benchbatch.app.cli import main\nmain()\n"
    done = run_without(("torch",), code)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "run" / "project.csv").is_file()
