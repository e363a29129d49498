"""make test's file scheduler (tests/schedule.py): with three workers the last never runs a lab file, the others run
the lab files first and then the host ones; with two, files go out in collection order as xdist's loadfile does."""

from __future__ import annotations

from types import SimpleNamespace

from tests.schedule import host_only_worker
from tests.xdist_schedule import LabWorkersFirst

COLLECTION = [
    "tests/vm/test_long.py::test_a", "tests/vm/test_long.py::test_b",
    "tests/vm/test_mid.py::test_a", "tests/vm/test_short.py::test_a",
    "tests/bpf/test_probe.py::test_a", "tests/ops/test_rules.py::test_a", "tests/ops/test_rules.py::test_b",
    "tests/unit/test_units.py::test_a", "tests/unit/test_units.py::test_b",
]


class Node:
    def __init__(self, name: str) -> None:
        self.gateway = SimpleNamespace(id=name)
        self.shutting_down = False
        self.sent: list[str] = []

    def send_runtest_some(self, indexes: list[int]) -> None:
        self.sent += [COLLECTION[i] for i in indexes]

    def shutdown(self) -> None:
        self.shutting_down = True

    def files(self) -> list[str]:
        return list(dict.fromkeys(nodeid.split("::")[0] for nodeid in self.sent))


def run(workers: int) -> dict[str, Node]:
    """Schedule COLLECTION on ``workers`` nodes and complete whatever a node was sent, one node at a time in turn,
    until nothing is pending."""
    config = SimpleNamespace(option=SimpleNamespace(loadscopereorder=False), getvalue=lambda name: [f"{workers}*popen"])
    sched = LabWorkersFirst(config)  # type: ignore[arg-type]
    nodes = {f"gw{i}": Node(f"gw{i}") for i in range(workers)}
    for node in nodes.values():
        sched.add_node(node)  # type: ignore[arg-type]
        sched.add_node_collection(node, COLLECTION)  # type: ignore[arg-type]
    sched.schedule()
    done: dict[str, int] = {name: 0 for name in nodes}
    while sched.has_pending:
        progressed = False
        for name, node in nodes.items():
            if done[name] < len(node.sent):
                sched.mark_test_complete(node, COLLECTION.index(node.sent[done[name]]))  # type: ignore[arg-type]
                done[name] += 1
                progressed = True
        assert progressed, "work pending that no node was sent"
    assert sorted(t for node in nodes.values() for t in node.sent) == sorted(COLLECTION)  # each test once
    return nodes


def test_three_workers_keep_lab_files_off_the_last_one() -> None:
    nodes = run(3)
    assert not any(f.startswith("tests/vm/") for f in nodes["gw2"].files()), nodes["gw2"].files()
    assert nodes["gw2"].files()[0] == "tests/bpf/test_probe.py"  # at once, not after the lab files
    lab = [f for name in ("gw0", "gw1") for f in nodes[name].files() if f.startswith("tests/vm/")]
    assert sorted(lab) == ["tests/vm/test_long.py", "tests/vm/test_mid.py", "tests/vm/test_short.py"]
    for name in ("gw0", "gw1"):  # a lab worker takes host files only once it holds no lab file to come
        files = nodes[name].files()
        assert files == sorted(files, key=lambda f: not f.startswith("tests/vm/")), files
    assert all(node.shutting_down for node in nodes.values())


def test_two_workers_take_files_in_collection_order() -> None:
    nodes = run(2)
    assert nodes["gw0"].files()[0] == "tests/vm/test_long.py" and nodes["gw1"].files()[0] == "tests/vm/test_mid.py"
    assert any(f.startswith("tests/unit/") for name in nodes for f in nodes[name].files())
    assert all(node.shutting_down for node in nodes.values())


def test_only_the_last_of_three_or_more_workers_is_host_only() -> None:
    assert [host_only_worker(f"gw{i}", 3) for i in range(3)] == [False, False, True]
    assert not any(host_only_worker(f"gw{i}", 2) for i in range(2)) and not host_only_worker("", 0)
