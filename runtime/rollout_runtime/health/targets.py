"""Which URLs a prober may touch: probes must not become a way to reach arbitrary hosts (SSRF).

In Kubernetes, anyone who can create a GenerationShard chooses the URL the operator fetches, from inside the
cluster. So the policy is an allowlist:

- schemes ``http`` and ``https`` only; no credentials in the URL;
- in-cluster Service names ``<svc>.<ns>.svc`` and ``<svc>.<ns>.svc.<cluster domain>`` are allowed by default;
- any other host must match ``allowed_hosts`` (shell-style patterns such as ``*.gpu.internal``, or CIDR blocks
  such as ``10.0.0.0/8``);
- loopback (``127.0.0.0/8``, ``::1``, ``localhost``) only with ``allow_loopback`` (tests, local mode);
- link-local and cloud metadata addresses (``169.254.0.0/16`` including ``169.254.169.254``, ``fe80::/10``,
  ``fd00:ec2::254``, ``100.100.100.200``, ``metadata.google.internal``), unspecified/"any" addresses
  (``0.0.0.0/8``, ``::``: connecting to them reaches this host) and multicast/broadcast addresses are refused
  always, whatever the allowlist says (``::/0`` included). IPv6 forms that carry an IPv4 address (mapped
  ``::ffff:a.b.c.d``, the deprecated compatible ``::a.b.c.d``, 6to4 ``2002:AABB:CCDD::``) are judged as the IPv4
  address they carry, so ``::ffff:127.0.0.1`` is loopback and ``::ffff:0.0.0.0`` unspecified;
- a URL whose path or query carries a credential (what :func:`~rollout_runtime.redaction.redact_secrets`
  recognises) is refused: the endpoint is published in statuses and the healthy set, which must never hold one.

Cluster-service names are allowed only in the target's own namespace when the caller says which namespace that is
(``check(url, namespace=...)``; the operator always does): a GenerationShard in ``team-a`` may not name
``x.team-b.svc``; another namespace's Service must be listed in ``allowed_hosts`` explicitly.

Names are checked as written and, at connect time, every address they resolve to is checked again
(:meth:`ProbeTargetPolicy.check_resolved`, used by the prober's resolver; the connection goes to exactly those
addresses, so there is no re-resolution gap). The rule for a resolved address: never a forbidden one (above),
loopback only with ``allow_loopback``, and, when ``allowed_hosts`` has CIDR blocks, a name allowed by a wildcard
pattern (``*.gpu.internal``: names a tenant may create) must resolve only into one of those blocks (a name allowed
by pattern must still resolve only to permitted addresses). A host listed exactly (``gpu-3.lab``, what
:meth:`for_endpoints` lists) and cluster-service names (cluster IPs) are constrained by the forbidden ranges only.
"""

from __future__ import annotations

import fnmatch
import ipaddress
import re
from collections.abc import Iterable
from typing import Final
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, field_validator

from rollout_runtime.redaction import redact_secrets, redact_url

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


_IPV4_COMPATIBLE: Final[ipaddress.IPv6Network] = ipaddress.IPv6Network("::/96")


def _mapped(address: IPAddress) -> IPAddress:
    """An IPv6 address that carries an IPv4 one is judged as that IPv4 address.

    Mapped (``::ffff:169.254.169.254``), deprecated IPv4-compatible (``::127.0.0.1``; ``::`` itself becomes
    ``0.0.0.0``, but ``::1`` stays the IPv6 loopback) and 6to4 (``2002:7f00:1::``).
    """
    if not isinstance(address, ipaddress.IPv6Address):
        return address
    if address.ipv4_mapped is not None:
        return address.ipv4_mapped
    if address in _IPV4_COMPATIBLE and address != ipaddress.IPv6Address("::1"):
        return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    if address.sixtofour is not None:
        return address.sixtofour
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
        if ip.is_unspecified:
            return TargetVerdict(allowed=False, reason=f"{ip} is an unspecified (any) address")
        for network in _ALWAYS_FORBIDDEN_NETWORKS:
            if ip.version == network.version and ip in network:
                return TargetVerdict(allowed=False, reason=f"{ip} is a link-local, metadata or non-unicast address")
        if ip.is_loopback and not self.allow_loopback:
            return TargetVerdict(allowed=False, reason=f"{ip} is loopback and loopback targets are not allowed")
        return TargetVerdict(allowed=True, reason="address allowed")

    def check_resolved(self, host: str, address: IPAddress | str) -> TargetVerdict:
        """Judge one address that ``host`` (a name already allowed by :meth:`check`) resolved to, at connect time."""
        verdict = self.check_address(address)
        if not verdict.allowed:
            return verdict
        parsed = _ip(address) if isinstance(address, str) else address
        assert parsed is not None  # check_address proved it parses
        ip = _mapped(parsed)
        name = host.lower().rstrip(".")
        if ip.is_loopback or name in _LOOPBACK_NAMES or _ip(name) is not None:
            return verdict  # loopback was judged above; an IP literal was judged as written
        if self.allow_cluster_services and self._is_cluster_service(name):
            return TargetVerdict(allowed=True, reason="cluster service address")
        if name in self.allowed_hosts:
            return verdict  # a host the operator named exactly (for_endpoints: the caller's own shards)
        networks = [pattern for pattern in self.allowed_hosts if "/" in pattern]
        if networks and not self._allowlisted("", ip, patterns=networks):
            return TargetVerdict(allowed=False, reason=f"{name} resolves to {ip}, which is not in allowed_hosts")
        return verdict

    def _allowlisted(self, host: str, ip: IPAddress | None, *, patterns: Iterable[str] | None = None) -> bool:
        for pattern in self.allowed_hosts if patterns is None else patterns:
            if "/" in pattern:
                if ip is not None:
                    network = ipaddress.ip_network(pattern, strict=False)
                    if ip.version == network.version and ip in network:
                        return True
            elif fnmatch.fnmatchcase(host, pattern):
                return True
        return False

    @staticmethod
    def _in_namespace(service: str, namespace: str | None) -> TargetVerdict:
        service_namespace = service.split(".")[1]
        if namespace is not None and service_namespace != namespace.lower():
            return TargetVerdict(
                allowed=False,
                reason=f"service namespace {service_namespace!r} is not the target's namespace {namespace[:63]!r}",
            )
        return TargetVerdict(allowed=True, reason="cluster service")

    def check_endpoint(self, url: str, namespace: str) -> TargetVerdict:
        """The rules for an endpoint as written in a spec: no credential in it, and a cluster-service URL names a
        Service in ``namespace`` (others pass here; the probe-time :meth:`check` judges the rest).

        For callers that know the target's namespace when they read its spec (the operator): such an endpoint is
        an invalid spec, never probed, never published.
        """
        if redact_secrets(url) != url:
            return TargetVerdict(allowed=False, reason="the URL carries a credential (path or query)")
        try:
            host = (urlsplit(url).hostname or "").lower()
        except ValueError:
            host = ""
        name = host.rstrip(".")
        if not self.allow_cluster_services or not self._is_cluster_service(host) or self._allowlisted(name, None):
            return TargetVerdict(allowed=True, reason="no credential, not a cluster service of another namespace")
        return self._in_namespace(name, namespace)

    def check(self, url: str, *, namespace: str | None = None) -> TargetVerdict:
        """Judge a URL before anything is sent to it; ``namespace``: the target's own (its cluster services only)."""
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
        if redact_secrets(url) != url:
            return TargetVerdict(allowed=False, reason="the URL carries a credential (path or query)")
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
        if self._allowlisted(name, None):
            return TargetVerdict(allowed=True, reason="allowlisted host")
        if self.allow_cluster_services and self._is_cluster_service(host):
            return self._in_namespace(name, namespace)
        return TargetVerdict(allowed=False, reason=f"host {name!r} is not a cluster service and not in allowed_hosts")

    def require(self, url: str, *, namespace: str | None = None) -> None:
        """Raise :class:`ForbiddenProbeTarget` unless the URL is allowed."""
        verdict = self.check(url, namespace=namespace)
        if not verdict.allowed:
            raise ForbiddenProbeTarget(f"refusing to probe {redact_url(url[:200])!r}: {verdict.reason}")
