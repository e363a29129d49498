"""`make test`'s order: the longest lab files start first (tests/schedule.py, LONGEST_FIRST), and xdist keeps the
collection order (--no-loadscope-reorder; its default puts the files with the most tests first)."""

from __future__ import annotations

from pathlib import Path

from tests.collected import collected
from tests.schedule import LONGEST_FIRST

ROOT = Path(__file__).resolve().parents[2]


def test_the_longest_files_exist_and_are_collected_first() -> None:
    names = list(LONGEST_FIRST)
    assert len(names) >= 3 and all((ROOT / n).is_file() for n in names), names  # a renamed file would drop out
    ids = collected(["-p", "no:xdist", "tests/vm", "tests/ops"])
    files = list(dict.fromkeys(i.partition("::")[0] for i in ids))
    assert files[:len(names)] == names, files[:len(names) + 3]
    assert "tests/ops/test_ansible.py" in files[len(names):]  # the rest still collected, after them


def test_make_test_keeps_the_collection_order() -> None:
    recipe = (ROOT / "Makefile").read_text().partition("\ntest:")[2].partition("\n\n")[0]
    assert "--dist loadfile" in recipe and "--no-loadscope-reorder" in recipe, recipe


def test_every_lab_file_has_its_place_in_the_longest_first_order() -> None:
    """A lab file left out would run after all the listed ones, where a long one leaves the other lab worker idle."""
    on_disk = {str(p.relative_to(ROOT)) for p in (ROOT / "tests" / "vm").glob("test_*.py")}
    assert set(LONGEST_FIRST) == on_disk and len(LONGEST_FIRST) == len(on_disk)
