"""make test's xdist scheduler (tests/schedule.py says why): whole files per worker in collection order, never a lab
file on the host-only worker. Imported by conftest.py's pytest_xdist_make_scheduler only, so where xdist runs."""

from __future__ import annotations

from typing import Any

from xdist.scheduler import LoadFileScheduling

from tests.schedule import LAB, host_only_worker


class LabWorkersFirst(LoadFileScheduling):
    """Whole files per worker, in collection order, but never a lab file on the host-only worker (the last of three
    or more)."""

    def _host_only(self, node: Any) -> bool:
        return host_only_worker(node.gateway.id, self.numnodes)

    def _next_scope(self, node: Any) -> str | None:
        """The first file in the queue this node may take."""
        if not self._host_only(node):
            return next(iter(self.workqueue), None)
        return next((scope for scope in self.workqueue if not scope.startswith(LAB)), None)

    def _assign_work_unit(self, node: Any) -> None:
        scope = self._next_scope(node)
        if scope is None:
            return
        self.workqueue.move_to_end(scope, last=False)  # the parent hands out the first file of the queue
        super()._assign_work_unit(node)

    def _reschedule(self, node: Any) -> None:
        if not node.shutting_down and self.workqueue and self._next_scope(node) is None:
            node.shutdown()  # only lab files are left: the host-only worker ends once its own files are done
            return
        super()._reschedule(node)
