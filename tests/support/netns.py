"""A network namespace the test makes, joined to the host by a veth pair: non-loopback pod IPs that stay local.

The API server refuses loopback addresses in EndpointSlices, so a pod the real EndpointSlice controller publishes
needs another address. ``network_namespace`` creates namespace ``rf-<N>-<pid>`` with a veth pair: host side
``10.250.N.1/24``, namespace side ``10.250.N.2/24`` (N: the first subnet no host address or route uses yet), IPv6
off on both ends (no router solicitations or neighbour discovery on the link) and no default route inside, so a
process in it can reach only the host's veth address, and the host reaches it only through the veth's /24. A sim
shard started by :meth:`NetworkNamespace.process` binds the namespace address; that is the pod IP tests write.

Needs root (or CAP_NET_ADMIN + CAP_SYS_ADMIN) and ``ip`` (iproute2) with ``ip netns``: without them the fixture
fails with what is missing. Everything is removed at teardown, also when the test failed (deleting the host end
of the veth deletes both ends; the namespace is deleted after its processes are stopped).
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import shutil
import subprocess
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import pytest

from support.processes import ManagedProcess

__all__ = ["NetworkNamespace", "network_namespace"]

BASE: Final[str] = "10.250"
"""Subnets ``10.250.N.0/24``, N in 1..254; private addresses nothing on a test machine is expected to route."""


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    ip = shutil.which("ip")
    if ip is None:
        pytest.fail("the network namespace fixture needs `ip` (iproute2) on PATH")
    return subprocess.run([ip, *args], capture_output=True, text=True, check=check, timeout=30)


def _used_networks() -> list[ipaddress.IPv4Network]:
    """Every IPv4 network the host has an address or a route in (so a chosen /24 collides with neither)."""
    used: list[ipaddress.IPv4Network] = []
    for entry in json.loads(_ip("-j", "-4", "addr").stdout or "[]"):
        for info in entry.get("addr_info", []):
            used.append(ipaddress.IPv4Network(f"{info['local']}/{info['prefixlen']}", strict=False))
    for route in json.loads(_ip("-j", "-4", "route", "show", "table", "all").stdout or "[]"):
        dst = route.get("dst", "default")
        if dst != "default":
            used.append(ipaddress.IPv4Network(dst if "/" in dst else f"{dst}/32", strict=False))
    return used


@dataclass(frozen=True)
class NetworkNamespace:
    """One namespace with its veth pair; processes are run inside with ``ip netns exec``."""

    name: str
    index: int
    host_interface: str

    @property
    def subnet(self) -> ipaddress.IPv4Network:
        return ipaddress.IPv4Network(f"{BASE}.{self.index}.0/24")

    @property
    def host_ip(self) -> str:
        return f"{BASE}.{self.index}.1"

    @property
    def ip(self) -> str:
        """The namespace's address: what a process in it binds and what a test writes as the pod IP."""
        return f"{BASE}.{self.index}.2"

    def process(
        self, name: str, argv: Sequence[str | os.PathLike[str]], log_path: Path, env: Mapping[str, str] | None = None
    ) -> ManagedProcess:
        """A :class:`ManagedProcess` that runs ``argv`` inside this namespace (``ip netns exec`` execs it, so the
        pid is the program's own and stopping it by pid works as for any other child)."""
        ip = shutil.which("ip") or "ip"
        return ManagedProcess(name, [ip, "netns", "exec", self.name, *argv], log_path, env=env)


def _disable_ipv6(namespace: str, interface: str) -> None:
    _ip("netns", "exec", namespace, "sysctl", "-qw", f"net.ipv6.conf.{interface}.disable_ipv6=1", check=False)
    _ip("netns", "exec", namespace, "sysctl", "-qw", "net.ipv6.conf.lo.disable_ipv6=1", check=False)


def _configure(namespace: NetworkNamespace, ns_if: str) -> None:
    host_if = namespace.host_interface
    with contextlib.suppress(OSError):  # no IPv6 on this host: nothing to silence
        Path(f"/proc/sys/net/ipv6/conf/{host_if}/disable_ipv6").write_text("1")
    _disable_ipv6(namespace.name, ns_if)
    _ip("addr", "add", f"{namespace.host_ip}/24", "dev", host_if)
    _ip("link", "set", host_if, "up")
    _ip("-n", namespace.name, "addr", "add", f"{namespace.ip}/24", "dev", ns_if)
    _ip("-n", namespace.name, "link", "set", ns_if, "up")


def create() -> NetworkNamespace:
    """Make a namespace and veth pair on the first free ``10.250.N.0/24``; fails the test saying what is missing."""
    probe = _ip("netns", "list", check=False)
    if probe.returncode != 0:
        pytest.fail(f"the network namespace fixture needs `ip netns` (root): {probe.stderr.strip()}")
    used = _used_networks()
    for index in range(1, 255):
        subnet = ipaddress.IPv4Network(f"{BASE}.{index}.0/24")
        if any(subnet.overlaps(net) for net in used):
            continue
        name, host_if, ns_if = f"rf-{index}-{os.getpid()}", f"rfh{index}", f"rfn{index}"
        added = _ip("netns", "add", name, check=False)
        if added.returncode != 0:
            if "exist" in added.stderr.lower():
                continue
            reason = added.stderr.strip()
            pytest.fail(f"`ip netns add {name}` failed (the fixture needs root / CAP_SYS_ADMIN): {reason}")
        made = _ip("link", "add", host_if, "type", "veth", "peer", "name", ns_if, "netns", name, check=False)
        if made.returncode != 0:
            _ip("netns", "del", name, check=False)
            if "exist" in made.stderr.lower():
                continue  # another test run holds this index right now
            pytest.fail(f"`ip link add {host_if} type veth` failed (needs CAP_NET_ADMIN): {made.stderr.strip()}")
        namespace = NetworkNamespace(name, index, host_if)
        try:
            _configure(namespace, ns_if)
        except BaseException:
            delete(namespace)
            raise
        return namespace
    pytest.fail(f"no free {BASE}.N.0/24 subnet for a test network namespace")


def delete(namespace: NetworkNamespace) -> None:
    """Remove the veth pair (both ends) and the namespace; quiet when either is already gone."""
    _ip("link", "del", namespace.host_interface, check=False)
    _ip("netns", "del", namespace.name, check=False)


@pytest.fixture
def network_namespace() -> Iterator[NetworkNamespace]:
    """A fresh namespace + veth pair for one test, removed afterwards whatever the outcome."""
    namespace = create()
    try:
        yield namespace
    finally:
        delete(namespace)
