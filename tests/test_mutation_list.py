"""scripts/mutations.py's breaks follow the code: each break's text is found exactly once
in its file, and each test it names exists (a break gone stale is no check at all, and the
full mutation run takes minutes, so the suite checks the list itself)."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _mutations():
    spec = importlib.util.spec_from_file_location("mutations", ROOT / "scripts/mutations.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


MUTATIONS = _mutations()


@pytest.mark.parametrize("brk", MUTATIONS.BREAKS, ids=lambda b: b.name[:60])
def test_each_break_applies_exactly_once(brk):
    assert MUTATIONS.status_of(ROOT, brk) is None


@pytest.mark.parametrize("brk", MUTATIONS.BREAKS, ids=lambda b: b.name[:60])
def test_each_break_names_tests_that_exist(brk):
    for target in brk.tests:
        path, _, node = target.partition("::")
        assert (ROOT / path).is_file(), target
        if node:
            name = node.split("[")[0]
            text = (ROOT / path).read_text(encoding="utf-8")
            assert re.search(rf"^\s*def {re.escape(name)}\(", text, re.M), target


def test_a_moved_text_is_reported_stale(tmp_path):
    brk = MUTATIONS.BREAKS[0]
    (tmp_path / brk.path).parent.mkdir(parents=True)
    (tmp_path / brk.path).write_text("nothing of the break here\n", encoding="utf-8")
    assert "not found" in MUTATIONS.status_of(tmp_path, brk)
    (tmp_path / brk.path).write_text(brk.find + "\n" + brk.find, encoding="utf-8")
    assert "found 2 times" in MUTATIONS.status_of(tmp_path, brk)
