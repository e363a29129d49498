"""tests/collected.py: a child `pytest --collect-only` reads the same ids whatever PYTEST_ADDOPTS the caller runs
with (a run with `-v --durations=0` failed three lab tests on an id tree the comparison could not read)."""

from __future__ import annotations

import pytest

from tests.collected import collected

TARGET = ["tests/unit/test_suite_order.py"]


def test_the_callers_addopts_do_not_change_the_ids(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PYTEST_ADDOPTS", raising=False)
    plain = collected(TARGET)
    assert plain and all(i.startswith("tests/unit/test_suite_order.py::test_") for i in plain), plain
    monkeypatch.setenv("PYTEST_ADDOPTS", "-v --durations=0")
    assert collected(TARGET) == plain


def test_env_reaches_the_child_and_a_bad_argument_is_an_error() -> None:
    # the lab's parameters: one block I/O variant ("default") instead of the host's two
    hotness = ["tests/bpf/test_hotness.py", "-k", "direct_writes"]
    assert {i.rpartition("[")[2] for i in collected(hotness)} == {"default]", "compat]"}
    assert {i.rpartition("[")[2] for i in collected(hotness, LAB_CACHED_DEV="collect-only")} == {"default]"}
    with pytest.raises(AssertionError, match="rc 4"):
        collected(["tests/unit/no_such_file.py"])
