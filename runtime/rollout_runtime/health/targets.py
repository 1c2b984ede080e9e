"""Which URLs a prober may touch: probes must not become a way to reach arbitrary hosts (SSRF).

In Kubernetes, anyone who can create a GenerationShard chooses the URL the operator fetches, from inside the
cluster. So the policy is an allowlist:

- schemes ``http`` and ``https`` only; no credentials in the URL;
- in-cluster Service names ``<svc>.<ns>.svc`` and ``<svc>.<ns>.svc.<cluster domain>`` are allowed by default;
- any other host must match ``allowed_hosts`` (shell-style patterns such as ``*.gpu.internal``, or CIDR blocks
  such as ``10.0.0.0/8``);
- loopback (``127.0.0.0/8``, ``::1``, ``localhost``) only with ``allow_loopback`` (tests, local mode);
- link-local and cloud metadata addresses (``169.254.0.0/16`` including ``169.254.169.254``, ``fe80::/10``,
  ``fd00:ec2::254``, ``100.100.100.200``, ``metadata.google.internal``) and unspecified/multicast addresses are
  refused always, whatever the allowlist says.

Names are checked as written and, at connect time, every address they resolve to is checked again
(:meth:`ProbeTargetPolicy.check_address`, used by the prober's resolver), so a DNS name cannot smuggle in a
metadata address.
"""

from __future__ import annotations

import fnmatch
import ipaddress
import re
from collections.abc import Iterable
from typing import Final
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, field_validator

from rollout_runtime.redaction import redact_url

__all__ = ["ForbiddenProbeTarget", "ProbeTargetPolicy", "TargetVerdict"]

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

_ALWAYS_FORBIDDEN_NETWORKS: Final[tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...]] = (
    ipaddress.ip_network("169.254.0.0/16"),  # link-local, incl. AWS/GCP/Azure metadata 169.254.169.254
    ipaddress.ip_network("fe80::/10"),  # IPv6 link-local
    ipaddress.ip_network("fd00:ec2::254/128"),  # AWS metadata over IPv6
    ipaddress.ip_network("100.100.100.200/32"),  # Alibaba Cloud metadata
    ipaddress.ip_network("0.0.0.0/8"),  # "this network"
    ipaddress.ip_network("224.0.0.0/4"),  # multicast
    ipaddress.ip_network("ff00::/8"),
    ipaddress.ip_network("255.255.255.255/32"),
)
_ALWAYS_FORBIDDEN_NAMES: Final[frozenset[str]] = frozenset(
    {"metadata", "metadata.google.internal", "metadata.goog", "instance-data", "instance-data.ec2.internal"}
)
_LOOPBACK_NAMES: Final[frozenset[str]] = frozenset({"localhost", "localhost.localdomain", "ip6-localhost"})
_DNS_LABEL: Final[str] = r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?"


class ForbiddenProbeTarget(ValueError):
    """A probe target URL (or an address it resolves to) is refused by the policy."""


class TargetVerdict(BaseModel):
    """The policy's answer for one URL or address."""

    model_config = ConfigDict(frozen=True)

    allowed: bool
    reason: str
    """Why, in a few words: "cluster service", "allowlisted", "loopback refused", "metadata address" ..."""


def _ip(host: str) -> IPAddress | None:
    try:
        return ipaddress.ip_address(host.strip("[]").split("%", 1)[0])
    except ValueError:
        return None


def _mapped(address: IPAddress) -> IPAddress:
    """IPv4-mapped IPv6 (``::ffff:169.254.169.254``) is judged as the IPv4 address it carries."""
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


class ProbeTargetPolicy(BaseModel):
    """An allowlist of probe targets. Pure: :meth:`check` returns a verdict, :meth:`require` raises."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    allowed_hosts: tuple[str, ...] = ()
    """Host patterns (``fnmatch``, case-insensitive) or CIDR blocks that explicit URLs may point at."""
    allow_cluster_services: bool = True
    """Allow ``<svc>.<ns>.svc[.<cluster_domain>]`` without listing them."""
    cluster_domain: str = "cluster.local"
    allow_loopback: bool = False
    """Allow 127.0.0.0/8, ::1 and localhost: for tests and the local demo fleet."""
    max_url_length: int = Field(default=2048, gt=0)

    @field_validator("allowed_hosts")
    @classmethod
    def _valid_patterns(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        cleaned = []
        for pattern in value:
            pattern = pattern.strip().lower()
            if not pattern or any(c.isspace() for c in pattern):
                raise ValueError(f"empty or blank host pattern in allowed_hosts: {pattern!r}")
            if "/" in pattern:
                ipaddress.ip_network(pattern, strict=False)  # raises ValueError with a clear message
            cleaned.append(pattern)
        return tuple(cleaned)

    @classmethod
    def local(cls) -> ProbeTargetPolicy:
        """Loopback only (plus cluster services): the policy for tests and the local demo fleet."""
        return cls(allow_loopback=True)

    @classmethod
    def for_endpoints(cls, endpoints: Iterable[str], *, allow_cluster_services: bool = True) -> ProbeTargetPolicy:
        """Allow exactly the hosts of the given endpoints (which the caller configured, so trusts).

        Loopback hosts among them turn on ``allow_loopback``; forbidden addresses stay forbidden.
        """
        hosts: list[str] = []
        loopback = False
        for endpoint in endpoints:
            host = (urlsplit(endpoint).hostname or "").lower()
            if not host:
                continue
            address = _ip(host)
            if host in _LOOPBACK_NAMES or (address is not None and _mapped(address).is_loopback):
                loopback = True
            hosts.append(host if address is None else str(address) + ("/128" if address.version == 6 else "/32"))
        return cls(
            allowed_hosts=tuple(dict.fromkeys(hosts)),
            allow_loopback=loopback,
            allow_cluster_services=allow_cluster_services,
        )

    def _is_cluster_service(self, host: str) -> bool:
        domain = re.escape(self.cluster_domain.strip(".").lower())
        return re.fullmatch(rf"{_DNS_LABEL}\.{_DNS_LABEL}\.svc(\.{domain})?\.?", host) is not None

    def check_address(self, address: IPAddress | str) -> TargetVerdict:
        """Judge one resolved address (never a name): forbidden ranges, then loopback."""
        ip = _ip(address) if isinstance(address, str) else address
        if ip is None:
            return TargetVerdict(allowed=False, reason=f"not an IP address: {address!r}")
        ip = _mapped(ip)
        for network in _ALWAYS_FORBIDDEN_NETWORKS:
            if ip.version == network.version and ip in network:
                return TargetVerdict(allowed=False, reason=f"{ip} is a link-local, metadata or non-unicast address")
        if ip.is_loopback and not self.allow_loopback:
            return TargetVerdict(allowed=False, reason=f"{ip} is loopback and loopback targets are not allowed")
        return TargetVerdict(allowed=True, reason="address allowed")

    def _allowlisted(self, host: str, ip: IPAddress | None) -> bool:
        for pattern in self.allowed_hosts:
            if "/" in pattern:
                if ip is not None:
                    network = ipaddress.ip_network(pattern, strict=False)
                    if ip.version == network.version and ip in network:
                        return True
            elif fnmatch.fnmatchcase(host, pattern):
                return True
        return False

    def check(self, url: str) -> TargetVerdict:
        """Judge a URL before anything is sent to it."""
        if len(url) > self.max_url_length:
            return TargetVerdict(allowed=False, reason=f"URL longer than {self.max_url_length} characters")
        try:
            parts = urlsplit(url)
            host = (parts.hostname or "").lower()
            parts.port  # noqa: B018 -- raises ValueError on a bad port
        except ValueError as exc:
            return TargetVerdict(allowed=False, reason=f"unparseable URL: {exc}")
        if parts.scheme not in ("http", "https"):
            return TargetVerdict(allowed=False, reason=f"scheme {parts.scheme!r} is not http or https")
        if not host:
            return TargetVerdict(allowed=False, reason="URL has no host")
        if parts.username is not None or parts.password is not None:
            return TargetVerdict(allowed=False, reason="credentials in the URL are not allowed")
        ip = _ip(host)
        if ip is not None:
            verdict = self.check_address(ip)
            if not verdict.allowed:
                return verdict
            if ip.is_loopback or (_mapped(ip).is_loopback):
                return TargetVerdict(allowed=True, reason="loopback allowed")
            if self._allowlisted(host, _mapped(ip)):
                return TargetVerdict(allowed=True, reason="allowlisted address")
            return TargetVerdict(allowed=False, reason=f"{ip} is not in allowed_hosts")
        name = host.rstrip(".")
        if name in _ALWAYS_FORBIDDEN_NAMES:
            return TargetVerdict(allowed=False, reason=f"{name} is a cloud metadata host")
        if name in _LOOPBACK_NAMES:
            if self.allow_loopback:
                return TargetVerdict(allowed=True, reason="loopback allowed")
            return TargetVerdict(allowed=False, reason=f"{name} is loopback and loopback targets are not allowed")
        if self.allow_cluster_services and self._is_cluster_service(host):
            return TargetVerdict(allowed=True, reason="cluster service")
        if self._allowlisted(name, None):
            return TargetVerdict(allowed=True, reason="allowlisted host")
        return TargetVerdict(allowed=False, reason=f"host {name!r} is not a cluster service and not in allowed_hosts")

    def require(self, url: str) -> None:
        """Raise :class:`ForbiddenProbeTarget` unless the URL is allowed."""
        verdict = self.check(url)
        if not verdict.allowed:
            raise ForbiddenProbeTarget(f"refusing to probe {redact_url(url[:200])!r}: {verdict.reason}")
