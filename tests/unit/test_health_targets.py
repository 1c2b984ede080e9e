"""The probe target policy: which URLs a prober may touch."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from rollout_runtime.health import ForbiddenProbeTarget, ProbeTargetPolicy

DEFAULT = ProbeTargetPolicy()
LOCAL = ProbeTargetPolicy.local()


@pytest.mark.parametrize(
    "url",
    [
        "http://vllm-0.rl.svc:8000/health",
        "http://vllm-0.rl.svc.cluster.local:8000/health",
        "https://vllm-0.rl.svc.cluster.local./health",
    ],
)
def test_cluster_service_names_are_allowed_by_default(url: str) -> None:
    assert DEFAULT.check(url).allowed


def test_cluster_services_can_be_turned_off() -> None:
    verdict = ProbeTargetPolicy(allow_cluster_services=False).check("http://vllm-0.rl.svc:8000/health")
    assert not verdict.allowed
    assert "allowed_hosts" in verdict.reason


def test_a_custom_cluster_domain_is_honoured() -> None:
    policy = ProbeTargetPolicy(cluster_domain="corp.k8s")
    assert policy.check("http://a.b.svc.corp.k8s/health").allowed
    assert not policy.check("http://a.b.svc.cluster.local/health").allowed


@pytest.mark.parametrize(
    "url",
    [
        "http://example.com/health",
        "http://10.0.0.7:8000/health",
        "http://a.b.c.svc.cluster.local/health",  # three labels before .svc: not a Service name
        "http://svc.cluster.local.evil.example/health",
    ],
)
def test_other_hosts_need_the_allowlist(url: str) -> None:
    verdict = DEFAULT.check(url)
    assert not verdict.allowed
    assert "not" in verdict.reason


def test_allowlist_patterns_and_cidr_blocks_admit_hosts() -> None:
    policy = ProbeTargetPolicy(allowed_hosts=("*.gpu.internal", "10.0.0.0/8"))
    assert policy.check("http://node7.gpu.internal:8000/health").allowed
    assert policy.check("http://NODE7.GPU.INTERNAL/health").allowed
    assert policy.check("http://10.3.4.5:8000/health").allowed
    assert not policy.check("http://11.3.4.5:8000/health").allowed
    assert not policy.check("http://gpu.internal.evil.example/health").allowed


@pytest.mark.parametrize(
    "url",
    [
        "http://169.254.169.254/latest/meta-data/",
        "http://[fe80::1]/health",
        "http://[fd00:ec2::254]/latest/meta-data/",
        "http://[::ffff:169.254.169.254]/",
        "http://100.100.100.200/",
        "http://metadata.google.internal/computeMetadata/v1/",
        "http://0.0.0.0:8000/health",
        "http://224.0.0.1/",
    ],
)
def test_metadata_and_link_local_targets_are_refused_even_when_allowlisted(url: str) -> None:
    policy = ProbeTargetPolicy(allowed_hosts=("*", "0.0.0.0/0", "::/0"), allow_loopback=True)
    assert not policy.check(url).allowed


@pytest.mark.parametrize("url", ["http://127.0.0.1:8000/health", "http://[::1]:8000/", "http://localhost:1/"])
def test_loopback_only_when_explicitly_allowed(url: str) -> None:
    assert not DEFAULT.check(url).allowed
    assert "loopback" in DEFAULT.check(url).reason
    assert LOCAL.check(url).allowed


@pytest.mark.parametrize(
    "url",
    [
        "ftp://vllm.rl.svc/health",
        "file:///etc/passwd",
        "gopher://vllm.rl.svc/",
        "http:///health",
        "http://user:pw@vllm.rl.svc/health",
        "http://vllm.rl.svc:99999/health",
        "http://[::1/health",
        "http://vllm.rl.svc/" + "a" * 3000,
    ],
)
def test_bad_urls_are_refused_with_a_reason(url: str) -> None:
    verdict = LOCAL.check(url)
    assert not verdict.allowed
    assert verdict.reason


def test_require_raises_a_clear_error() -> None:
    with pytest.raises(ForbiddenProbeTarget, match=r"refusing to probe .*169\.254\.169\.254.*metadata"):
        DEFAULT.require("http://169.254.169.254/")
    DEFAULT.require("http://vllm.rl.svc/health")


def test_for_endpoints_allows_exactly_the_configured_hosts() -> None:
    policy = ProbeTargetPolicy.for_endpoints(["http://127.0.0.1:9000", "http://gpu-3.lab:8000", "http://[::1]:1"])
    assert policy.allow_loopback
    assert policy.check("http://gpu-3.lab:8000/health").allowed
    assert not policy.check("http://gpu-4.lab:8000/health").allowed
    assert not ProbeTargetPolicy.for_endpoints(["http://gpu-3.lab:8000"]).allow_loopback


def test_check_address_judges_resolved_addresses() -> None:
    assert not DEFAULT.check_address("169.254.169.254").allowed
    assert not DEFAULT.check_address("127.0.0.1").allowed
    assert LOCAL.check_address("127.0.0.1").allowed
    assert DEFAULT.check_address("10.1.2.3").allowed
    assert not DEFAULT.check_address("not-an-ip").allowed


def test_invalid_allowlist_entries_are_rejected() -> None:
    with pytest.raises(ValidationError):
        ProbeTargetPolicy(allowed_hosts=("10.0.0.0/99",))
    with pytest.raises(ValidationError):
        ProbeTargetPolicy(allowed_hosts=(" ",))


@given(st.text(max_size=200))
def test_check_never_raises(url: str) -> None:
    """Invariant: any string gets a verdict with a reason; nothing raises."""
    verdict = LOCAL.check(url)
    assert verdict.reason


@given(st.ip_addresses())
def test_link_local_addresses_are_never_allowed(address: object) -> None:
    """Invariant: no policy, however permissive, allows a link-local address."""
    permissive = ProbeTargetPolicy(allowed_hosts=("*", "0.0.0.0/0", "::/0"), allow_loopback=True)
    verdict = permissive.check_address(str(address))
    if getattr(address, "is_link_local", False):
        assert not verdict.allowed
