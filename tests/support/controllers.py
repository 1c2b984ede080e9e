"""A real kube-controller-manager against the test control plane, with only the controllers a test needs.

Opt-in: only tests that request ``controller_manager`` start it (once per session, after the CRDs exist, so the
garbage collector's discovery sees them at start). It runs the garbage collector (ownerReferences) and the
EndpointSlice controller (or whatever a :class:`ControllerManager` is given), with leader election off and no
serving port; it is stopped by pid. There is still no kubelet or scheduler: tests write pod status themselves, bind
pods to a Node object they create, and use pod IPs on 127.0.0.0/8 or in a network namespace the test made.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Final

import pytest

from support.controlplane import ControlPlane
from support.processes import ManagedProcess, wait_until
from support.tools import tool_path

CONTROLLERS: Final[tuple[str, ...]] = ("garbage-collector-controller", "endpointslice-controller")
"""What the e2e tests need: ownerReference garbage collection, and Service -> EndpointSlice. The API server refuses
loopback addresses in an EndpointSlice, so the controller's slices for pods on 127.0.0.0/8 are never written; the
EndpointSlice test gives its pod a network namespace's address instead (tests/support/netns.py)."""
START_TIMEOUT: Final[float] = 90.0
_READY_LINES: Final[tuple[str, ...]] = ("all resource monitors have synced", "Garbage collector: all resource monitors")


class ControllerManager:
    """kube-controller-manager as a child process, admin credentials, the given controllers only."""

    def __init__(self, plane: ControlPlane, workdir: Path, controllers: tuple[str, ...] = CONTROLLERS) -> None:
        self.plane = plane
        self.controllers = controllers
        workdir.mkdir(parents=True, exist_ok=True)
        self.process = ManagedProcess(
            "kube-controller-manager",
            [
                str(tool_path("kube-controller-manager")),
                f"--kubeconfig={plane.kubeconfig}",
                f"--controllers={','.join(controllers)}",
                "--leader-elect=false",
                "--secure-port=0",  # no serving port: nothing here scrapes or probes it
                "--use-service-account-credentials=false",
                "--endpointslice-updates-batch-period=0s",
                "--v=2",
            ],
            workdir / "kube-controller-manager.log",
            env=plane.env(),
        )

    def start(self) -> None:
        self.process.start()
        wait_until(self._gc_synced, timeout=START_TIMEOUT, what="the garbage collector to sync", process=self.process)

    def stop(self) -> None:
        self.process.stop()

    def _gc_synced(self) -> bool:
        if "garbage-collector-controller" not in self.controllers:
            return True
        log = self.process.tail(400)
        return any(line in log for line in _READY_LINES)


@pytest.fixture(scope="session")
def controller_manager(
    fleet_crds: ControlPlane, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ControllerManager]:
    """The session's kube-controller-manager (EndpointSlice + garbage collector) on the real control plane."""
    manager = ControllerManager(fleet_crds, tmp_path_factory.mktemp("controller-manager"))
    try:
        manager.start()
        yield manager
    finally:
        manager.stop()
