#!/usr/bin/env python3
"""A real single-node Kubernetes on this machine (issue 36): pods run, and pods really die.

etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kubelet, kube-proxy (nftables) and CoreDNS, with
Debian's containerd and runc and the bridge CNI plugin, every binary from ``scripts/install-tools.sh`` (nothing is
installed system-wide) and every image built here (``tools/images.py``: no registry is ever asked).

``up`` runs in the foreground as the node's supervisor and tears everything down when it ends (SIGTERM, SIGINT, or
one of its components dying); ``down`` undoes whatever a node that was killed outright left behind, and ``up`` runs
it first. The host is left as it was found: the sysctls kubelet and the bridge change are saved before and restored
after, the bridge, network namespaces, nftables tables, mounts and cgroups the node made are removed.

What this machine needs and the node does (see docs/testing.md, "The cluster tier"):
- root; cgroup v1 only: kubelet ``failCgroupV1: false``, ``cgroupDriver: cgroupfs``, its ``cgroupRoot`` created in
  every hierarchy;
- root lacks CAP_SYS_RESOURCE: containerd's ``restrict_oom_score_adj``, or no sandbox starts;
- no registry: images imported with ``ctr -n k8s.io images import``, image GC off, pulls sent to a closed port on
  127.0.0.1 so a mistyped image fails at once;
- network: every listener on 127.0.0.1 or the bridge address; forwarding between the bridge and any other interface
  dropped; CoreDNS serves cluster.local only, with no upstream. Nothing leaves the machine;
- fixed host paths (/run/containerd/s, /var/lib/kubelet/device-plugins): one node per machine, under a lock.

Usage (as root):
    node.py up [--ready-file PATH] [--host-state PATH]
                                      bring the node up and supervise it until signalled
    node.py down                      tear down whatever a previous node left (idempotent)
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import secrets
import shutil
import signal
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from pins import versions

ROOT = Path(__file__).resolve().parent.parent
NAME = "rollout-fleet-node"
STATE = Path("/var/lib") / NAME
RUN = Path("/run") / NAME
LOCK = Path("/run/lock") / f"{NAME}.lock"
BRIDGE = "rfnode0"
NODE_IP = "10.244.0.1"
POD_CIDR = "10.244.0.0/24"
SERVICE_CIDR = "10.96.0.0/24"
KUBERNETES_SERVICE_IP = "10.96.0.1"
API_PORT = 6443
ETCD_PORTS = (23790, 23800)
CLOSED_REGISTRY = "http://127.0.0.1:9"
"""The discard port: nothing listens there, so a pull fails at once instead of resolving a registry."""
CGROUP_ROOT = f"/{NAME}"
NFT_TABLE = "rollout_fleet_node"
SYSCTLS = (
    "vm/overcommit_memory",  # kubelet
    "kernel/panic",  # kubelet
    "kernel/panic_on_oops",  # kubelet
    "net/ipv4/ip_forward",  # pod -> Service -> pod is routed through the host
    "net/bridge/bridge-nf-call-iptables",  # bridged replies pass conntrack, so Service DNAT is undone
)
IMAGE = "ghcr.io/rollout-fleet/rollout-fleet-operator:0.1.0"
"""What the chart and examples/ run (the operator, the sim shards and the verifier)."""
PAUSE_IMAGE = "registry.k8s.io/pause:3.10"
FIXED_PATHS = ("/var/lib/kubelet", "/run/containerd")
"""Host paths kubelet (device-plugins) and containerd 1.6 (its shims' sockets, /run/containerd/s) always use."""
COMPONENTS = ("coredns", "kube-proxy", "kubelet", "kube-scheduler", "kube-controller-manager", "containerd")
"""Stopped in this order (the API server and etcd last)."""


STOP = {"signal": 0}
"""Set by SIGTERM/SIGINT: the supervisor stops waiting (starting up, or supervising) and tears the node down."""


def say(message: str) -> None:
    print(f"node: {message}", file=sys.stderr, flush=True)


def cache() -> Path:
    return Path(os.environ.get("ROLLOUT_FLEET_CACHE", Path.home() / ".cache" / "rollout-fleet"))


def tool(directory: str, version_key: str, *path: str) -> Path:
    """A file of a tool install-tools.sh installed (``bin/NAME``, or ``root/...`` inside an unpacked package)."""
    found = cache() / "tools" / f"{directory}-{versions()[version_key]}"
    target = found.joinpath(*path)
    if not target.exists():
        raise SystemExit(f"node: {target} is missing: run `bash scripts/install-tools.sh` with the node's tools")
    return target


def run(*argv: str | os.PathLike[str], check: bool = True, env: dict[str, str] | None = None) -> str:
    done = subprocess.run(
        [os.fspath(a) for a in argv], capture_output=True, text=True, stdin=subprocess.DEVNULL, env=env, check=False
    )
    if check and done.returncode != 0:
        raise SystemExit(
            f"node: {' '.join(os.fspath(a) for a in argv)} failed: {done.stderr.strip() or done.stdout.strip()}"
        )
    return done.stdout


def write(path: Path, text: str, mode: int = 0o644) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(mode)
    return path


# --- credentials ----------------------------------------------------------------------------------------------


def openssl(*args: str | os.PathLike[str]) -> None:
    run("openssl", *args)


def credentials(pki: Path) -> str:
    """A CA; the API server's serving cert (bridge address, Service IP, names); its client cert for kubelets; the
    service-account signing key; an admin token. Returns the token."""
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    pki.mkdir(parents=True, exist_ok=True)
    openssl("req", "-x509", *ec, "-keyout", pki / "ca.key", "-out", pki / "ca.crt", "-days", "30",
            "-subj", f"/CN={NAME}-ca", "-addext", "basicConstraints=critical,CA:TRUE",
            "-addext", "keyUsage=critical,keyCertSign,cRLSign")  # fmt: skip
    names = ",".join(
        [f"IP:{NODE_IP}", "IP:127.0.0.1", f"IP:{KUBERNETES_SERVICE_IP}", "DNS:localhost", "DNS:kubernetes"]
        + [f"DNS:kubernetes.default{suffix}" for suffix in ("", ".svc", ".svc.cluster.local")]
    )
    for name, subject, usage, san in (
        ("apiserver", "/CN=kube-apiserver", "serverAuth", f"subjectAltName={names}\n"),
        ("kubelet-client", "/O=system:masters/CN=kube-apiserver-kubelet-client", "clientAuth", ""),
    ):
        openssl("req", "-new", *ec, "-keyout", pki / f"{name}.key", "-out", pki / f"{name}.csr", "-subj", subject)
        write(pki / f"{name}.ext", f"{san}basicConstraints=critical,CA:FALSE\nextendedKeyUsage={usage}\n")
        signed: list[str | os.PathLike[str]] = [
            "-CA",
            pki / "ca.crt",
            "-CAkey",
            pki / "ca.key",
            "-CAcreateserial",
            "-days",
            "30",
        ]
        openssl("x509", "-req", "-in", pki / f"{name}.csr", *signed, "-out", pki / f"{name}.crt",
                "-extfile", pki / f"{name}.ext")  # fmt: skip
    openssl("genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", pki / "sa.key")
    openssl("pkey", "-in", pki / "sa.key", "-pubout", "-out", pki / "sa.pub")
    token = secrets.token_hex(24)
    write(pki / "tokens.csv", f'{token},admin,admin-uid,"system:masters"\n', 0o600)
    return token


def kubeconfig(path: Path, ca: Path, token: str) -> Path:
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {"name": NAME, "cluster": {"server": f"https://{NODE_IP}:{API_PORT}", "certificate-authority": str(ca)}}
        ],
        "users": [{"name": "admin", "user": {"token": token}}],
        "contexts": [{"name": NAME, "context": {"cluster": NAME, "user": "admin", "namespace": "default"}}],
        "current-context": NAME,
    }
    return write(path, json.dumps(config, indent=2), 0o600)


# --- host state: sysctls, network, cgroups, mounts ------------------------------------------------------------


def save_sysctls() -> None:
    saved = STATE / "sysctls.json"
    if saved.exists():  # a killed node's record of the host as it was: keep it
        return
    values = {key: Path("/proc/sys", key).read_text().strip() for key in SYSCTLS if Path("/proc/sys", key).exists()}
    write(saved, json.dumps(values))


def restore_sysctls() -> None:
    saved = STATE / "sysctls.json"
    if not saved.exists():
        return
    for key, value in json.loads(saved.read_text()).items():
        with contextlib.suppress(OSError):
            Path("/proc/sys", key).write_text(value)
    saved.unlink()


def _nft(script: str, check: bool) -> str:
    done = subprocess.run(
        [os.fspath(tool("nftables", "NFTABLES_VERSION", "bin", "nft")), "-f", "-"],
        input=script, capture_output=True, text=True, check=False,
    )  # fmt: skip
    if check and done.returncode != 0:
        raise SystemExit(f"node: nft failed: {done.stderr.strip()}\n{script}")
    return done.stdout


def network_up() -> None:
    """The bridge with the node's address, and a forward filter that keeps pods' traffic on the machine."""
    run("ip", "link", "add", BRIDGE, "type", "bridge")
    run("ip", "addr", "add", f"{NODE_IP}/24", "dev", BRIDGE)
    run("ip", "link", "set", BRIDGE, "up")
    _nft(
        f"""table inet {NFT_TABLE} {{
  chain forward {{
    type filter hook forward priority filter - 10; policy accept;
    iifname "{BRIDGE}" oifname != "{BRIDGE}" drop
    oifname "{BRIDGE}" iifname != "{BRIDGE}" drop
  }}
}}
""",
        True,
    )
    for key, value in (("net/ipv4/ip_forward", "1"), ("net/bridge/bridge-nf-call-iptables", "1")):
        Path("/proc/sys", key).write_text(value)


def network_down() -> None:
    for netns in Path("/run/netns").glob("cni-*") if (STATE / "containerd").exists() else ():
        run("ip", "netns", "delete", netns.name, check=False)
    run("ip", "link", "delete", BRIDGE, check=False)
    nft_bin = cache() / "tools" / f"nftables-{versions()['NFTABLES_VERSION']}" / "bin" / "nft"
    if nft_bin.exists():
        for family, table in (("inet", NFT_TABLE), ("ip", "kube-proxy"), ("ip6", "kube-proxy")):
            subprocess.run([nft_bin, "delete", "table", family, table], capture_output=True, check=False)


def hierarchies() -> list[Path]:
    """Every cgroup v1 hierarchy (and the v2 one mounted beside them, if any)."""
    mounts = Path("/proc/self/mounts").read_text().splitlines()
    return [Path(fields[1]) for line in mounts if (fields := line.split())[2] in ("cgroup", "cgroup2")]


def cgroups_up() -> None:
    for hierarchy in hierarchies():
        (hierarchy / CGROUP_ROOT.lstrip("/")).mkdir(exist_ok=True)


def cgroup_processes() -> set[int]:
    pids: set[int] = set()
    for hierarchy in hierarchies():
        base = hierarchy / CGROUP_ROOT.lstrip("/")
        for procs in base.rglob("cgroup.procs") if base.exists() else ():
            with contextlib.suppress(OSError):
                pids.update(int(line) for line in procs.read_text().split())
    return pids


def cgroups_down() -> None:
    """Kill what is left in the node's cgroups (containers whose shim died with containerd), then remove them."""
    for _ in range(50):
        pids = cgroup_processes()
        if not pids:
            break
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.1)  # the kernel reaps asynchronously; re-read until the cgroups are empty (bounded)
    for hierarchy in hierarchies():
        base = hierarchy / CGROUP_ROOT.lstrip("/")
        if base.exists():
            for directory in sorted((p for p in base.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
                with contextlib.suppress(OSError):
                    directory.rmdir()
            with contextlib.suppress(OSError):
                base.rmdir()


def shims() -> list[int]:
    """containerd's shims for this node's containerd (its socket address is in their command line): they outlive
    containerd, in containerd's cgroup rather than the pods'."""
    address = f"-address\0{RUN / 'containerd.sock'}\0".encode()
    found = []
    for proc in Path("/proc").glob("[0-9]*"):
        with contextlib.suppress(OSError):
            if address in (proc / "cmdline").read_bytes():
                found.append(int(proc.name))
    return found


def shims_down() -> None:
    for pid in shims():
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def unmount_all() -> None:
    """Every mount under the node's directories (overlay snapshots, pod volumes, netns files), deepest first."""
    prefixes = (str(STATE), str(RUN), "/run/containerd", "/var/lib/kubelet", "/run/netns/cni-")
    targets = [line.split()[1] for line in Path("/proc/self/mounts").read_text().splitlines()]
    ours = [t for t in targets if t.startswith(prefixes)] if (STATE.exists() or RUN.exists()) else []
    for target in sorted(set(ours), key=lambda t: -t.count("/")):
        run("umount", "-l", target, check=False)


# --- processes ------------------------------------------------------------------------------------------------


class Component:
    """One of the node's daemons: started in its own session, logging to a file, its pid recorded for ``down``."""

    def __init__(self, name: str, argv: Sequence[str | os.PathLike[str]], env: dict[str, str] | None = None) -> None:
        self.name, self.argv, self.env = name, [os.fspath(a) for a in argv], env
        self.popen: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        log = (STATE / "logs" / f"{self.name}.log").open("ab")
        self.popen = subprocess.Popen(
            self.argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=self.env,
            start_new_session=True,
        )  # fmt: skip
        write(RUN / "pids" / f"{self.name}.pid", f"{self.popen.pid} {self.argv[0]}\n")

    def tail(self, lines: int = 30) -> str:
        text = (STATE / "logs" / f"{self.name}.log").read_text(errors="replace")
        return "\n".join(text.splitlines()[-lines:])


def stop_recorded(name: str, timeout: float = 20.0) -> None:
    """SIGTERM (then SIGKILL) the pid recorded for ``name``, if it still runs the binary recorded with it."""
    record = RUN / "pids" / f"{name}.pid"
    if not record.exists():
        return
    pid_text, _, binary = record.read_text().strip().partition(" ")
    pid = int(pid_text)
    try:
        running = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode() == binary
    except OSError:
        running = False
    if running:
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
            with contextlib.suppress(ChildProcessError):
                if os.waitpid(pid, os.WNOHANG)[0]:
                    break
            time.sleep(0.1)  # waiting for a process that is not ours to exit: poll with a deadline
        if Path(f"/proc/{pid}").exists():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    record.unlink()


def wait_for(what: str, check: Callable[[], bool], timeout: float, component: Component | None = None) -> None:
    """Poll ``check`` with a deadline; fail naming what was awaited (and the component's log, if it exited)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if STOP["signal"]:
            raise SystemExit(f"node: signal {STOP['signal']} while waiting for {what}: tearing down")
        if component is not None and component.popen is not None and component.popen.poll() is not None:
            raise SystemExit(f"node: {component.name} exited while waiting for {what}:\n{component.tail()}")
        with contextlib.suppress(Exception):
            if check():
                return
        time.sleep(0.2)  # polling a condition with a deadline
    tail = f":\n{component.tail()}" if component is not None else ""
    raise SystemExit(f"node: timed out waiting for {what}{tail}")


def https_ok(url: str, ca: Path, token: str) -> bool:
    context = ssl.create_default_context(cafile=str(ca))
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"})
    try:
        with urllib.request.urlopen(request, timeout=2, context=context) as answer:
            return bool(answer.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as answer:
            return bool(answer.status == 200)
    except (urllib.error.URLError, OSError):
        return False


# --- configuration --------------------------------------------------------------------------------------------


def containerd_config() -> Path:
    runc = tool("runc", "RUNC_VERSION", "root", "usr", "sbin", "runc")
    cni = tool("containernetworking-plugins", "CNI_PLUGINS_VERSION", "root", "usr", "lib", "cni")
    hosts = f'server = "{CLOSED_REGISTRY}"\n[host."{CLOSED_REGISTRY}"]\n  capabilities = ["pull", "resolve"]\n'
    write(STATE / "certs.d" / "_default" / "hosts.toml", hosts)
    cri = 'plugins."io.containerd.grpc.v1.cri"'
    return write(
        STATE / "containerd.toml",
        f"""version = 2
root = "{STATE / "containerd"}"
state = "{RUN / "containerd"}"
[grpc]
  address = "{RUN / "containerd.sock"}"
[ttrpc]
  address = "{RUN / "containerd.sock.ttrpc"}"
[metrics]
  address = ""
[{cri}]
  sandbox_image = "{PAUSE_IMAGE}"
  restrict_oom_score_adj = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  [{cri}.containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [{cri}.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [{cri}.containerd.runtimes.runc.options]
        BinaryName = "{runc}"
        SystemdCgroup = false
  [{cri}.cni]
    bin_dir = "{cni}"
    conf_dir = "{STATE / "cni" / "net.d"}"
  [{cri}.registry]
    config_path = "{STATE / "certs.d"}"
""",
    )


def cni_config() -> None:
    bridge = {
        "type": "bridge", "bridge": BRIDGE, "isGateway": True, "ipMasq": False, "hairpinMode": True,
        "ipam": {"type": "host-local", "ranges": [[{"subnet": POD_CIDR, "gateway": NODE_IP}]],
                 "routes": [{"dst": "0.0.0.0/0"}], "dataDir": str(STATE / "cni" / "ipam")},
    }  # fmt: skip
    conflist = {"cniVersion": "0.4.0", "name": NAME, "plugins": [bridge]}
    write(STATE / "cni" / "net.d" / "10-rollout-fleet-node.conflist", json.dumps(conflist, indent=2))


def kubelet_config(ca: Path) -> Path:
    config = {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "failCgroupV1": False,
        "cgroupDriver": "cgroupfs",
        "cgroupRoot": CGROUP_ROOT,
        "address": NODE_IP,
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "authentication": {"anonymous": {"enabled": False}, "webhook": {"enabled": False},
                           "x509": {"clientCAFile": str(ca)}},
        "authorization": {"mode": "AlwaysAllow"},
        "clusterDNS": [NODE_IP],
        "clusterDomain": "cluster.local",
        "resolvConf": str(write(STATE / "resolv.conf", "")),
        "containerRuntimeEndpoint": f"unix://{RUN / 'containerd.sock'}",
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "evictionHard": {"memory.available": "100Mi", "nodefs.available": "1%", "imagefs.available": "1%",
                         "nodefs.inodesFree": "1%"},
        "failSwapOn": False,
        "podLogsDir": str(STATE / "pod-logs"),
        "serializeImagePulls": False,
        "maxPods": 40,
    }  # fmt: skip
    return write(STATE / "kubelet.json", json.dumps(config, indent=2))


def kube_proxy_config(admin: Path) -> Path:
    config = {
        "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
        "kind": "KubeProxyConfiguration",
        "mode": "nftables",
        "clientConnection": {"kubeconfig": str(admin)},
        "hostnameOverride": NAME,
        "clusterCIDR": POD_CIDR,
        "bindAddress": NODE_IP,
        "healthzBindAddress": "127.0.0.1:10256",
        "metricsBindAddress": "127.0.0.1:10249",
        "nodePortAddresses": [f"{NODE_IP}/32"],
    }
    return write(STATE / "kube-proxy.json", json.dumps(config, indent=2))


def corefile(admin: Path) -> Path:
    return write(
        STATE / "Corefile",
        f""".:53 {{
    bind {NODE_IP}
    errors
    health 127.0.0.1:18080
    ready 127.0.0.1:18181
    kubernetes cluster.local in-addr.arpa ip6.arpa {{
        kubeconfig {admin} {NAME}
        pods insecure
    }}
}}
""",
    )


# --- up and down ----------------------------------------------------------------------------------------------


@contextlib.contextmanager
def node_lock(wait: bool) -> Iterator[None]:
    """One node per machine (fixed host paths): a second ``up`` waits (``--wait-lock``) or fails naming the holder."""
    LOCK.parent.mkdir(parents=True, exist_ok=True)
    with LOCK.open("a+") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read().strip()
            raise SystemExit(f"node: another node is up on this machine (lock {LOCK} held by pid {holder})") from None
        handle.seek(0)
        handle.truncate()
        handle.write(str(os.getpid()))
        handle.flush()
        yield


def host_state() -> dict[str, Any]:
    """What the node may change on the host and must give back: the sysctls it sets, its bridge, its and kube-proxy's
    nftables tables, its mounts and cgroups, and the fixed host paths its parts use. Only the node's own names are
    compared: other sessions on this machine create and remove their own links and mounts meanwhile."""
    nft = tool("nftables", "NFTABLES_VERSION", "bin", "nft")
    tables = subprocess.run([nft, "list", "tables"], capture_output=True, text=True, check=True).stdout.splitlines()
    ours = {f"table inet {NFT_TABLE}", "table ip kube-proxy", "table ip6 kube-proxy"}
    mounts = [line.split()[1] for line in Path("/proc/self/mounts").read_text().splitlines()]
    prefixes = (str(STATE), str(RUN), *FIXED_PATHS)
    cgroup = CGROUP_ROOT.lstrip("/")
    paths = (*FIXED_PATHS, str(STATE), str(RUN))
    return {
        "sysctls": {key: Path("/proc/sys", key).read_text().strip() for key in SYSCTLS},
        "bridge": Path("/sys/class/net", BRIDGE).exists(),
        "nft": sorted(set(tables) & ours),
        "mounts": sorted(m for m in mounts if m.startswith(prefixes)),
        "cgroups": sorted(str(h) for h in hierarchies() if (h / cgroup).exists()),
        "paths": {path: Path(path).exists() for path in paths},
        "shims": shims(),
    }


def down() -> None:
    """Tear down whatever a node left: components by recorded pid, containers by cgroup, then the host's state."""
    for name in COMPONENTS:
        stop_recorded(name)
    cgroups_down()
    shims_down()
    for name in ("kube-apiserver", "etcd"):
        stop_recorded(name)
    unmount_all()
    network_down()
    restore_sysctls()
    for fixed in FIXED_PATHS:  # the host paths the node's parts cannot be told to avoid, if it created them
        if (STATE / f"created{fixed.replace('/', '-')}").exists():
            shutil.rmtree(fixed, ignore_errors=True)
    shutil.rmtree(RUN, ignore_errors=True)
    shutil.rmtree(STATE, ignore_errors=True)


def up(ready_file: Path | None, images: Path) -> int:
    down()
    for directory in (STATE / "logs", RUN / "pids"):
        directory.mkdir(parents=True)
    save_sysctls()
    for fixed in FIXED_PATHS:
        if not Path(fixed).exists():
            (STATE / f"created{fixed.replace('/', '-')}").touch()
    network_up()
    cgroups_up()
    pki = STATE / "pki"
    token = credentials(pki)
    admin = kubeconfig(STATE / "admin.kubeconfig", pki / "ca.crt", token)
    names = ("kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubelet", "kube-proxy")
    kube = {name: tool(name, "KUBERNETES_VERSION", "bin", name) for name in names}
    etcd_url = f"http://127.0.0.1:{ETCD_PORTS[0]}"
    peer = f"http://127.0.0.1:{ETCD_PORTS[1]}"
    containerd_bin = tool("containerd", "CONTAINERD_VERSION", "root", "usr", "bin")
    path = f"{containerd_bin}:{tool('nftables', 'NFTABLES_VERSION', 'bin')}:{os.environ.get('PATH', '/usr/bin:/bin')}"
    env = {"PATH": path, "HOME": str(STATE)}
    components = [
        Component("etcd", [tool("etcd", "ETCD_VERSION", "bin", "etcd"), "--name=node", f"--data-dir={STATE / 'etcd'}",
                           f"--listen-client-urls={etcd_url}", f"--advertise-client-urls={etcd_url}",
                           f"--listen-peer-urls={peer}", f"--initial-advertise-peer-urls={peer}",
                           f"--initial-cluster=node={peer}", "--log-level=warn", "--unsafe-no-fsync"], env),
        Component("kube-apiserver", [kube["kube-apiserver"], f"--etcd-servers={etcd_url}",
                                     f"--bind-address={NODE_IP}", f"--advertise-address={NODE_IP}",
                                     f"--secure-port={API_PORT}", f"--cert-dir={pki}",
                                     f"--tls-cert-file={pki / 'apiserver.crt'}",
                                     f"--tls-private-key-file={pki / 'apiserver.key'}",
                                     f"--client-ca-file={pki / 'ca.crt'}",
                                     f"--kubelet-client-certificate={pki / 'kubelet-client.crt'}",
                                     f"--kubelet-client-key={pki / 'kubelet-client.key'}",
                                     # exec, logs, port-forward: dial the kubelet at the node's IP; by its hostname
                                     # (the default's first choice) it would ask the host's resolver, off the machine
                                     "--kubelet-preferred-address-types=InternalIP",
                                     f"--token-auth-file={pki / 'tokens.csv'}", "--authorization-mode=Node,RBAC",
                                     "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
                                     f"--service-account-key-file={pki / 'sa.pub'}",
                                     f"--service-account-signing-key-file={pki / 'sa.key'}",
                                     f"--service-cluster-ip-range={SERVICE_CIDR}", "--profiling=false"], env),
        Component("kube-controller-manager", [kube["kube-controller-manager"], f"--kubeconfig={admin}",
                                              "--leader-elect=false", "--secure-port=0",
                                              "--use-service-account-credentials=false",
                                              f"--root-ca-file={pki / 'ca.crt'}",
                                              f"--service-account-private-key-file={pki / 'sa.key'}",
                                              f"--service-cluster-ip-range={SERVICE_CIDR}"], env),
        Component("kube-scheduler", [kube["kube-scheduler"], f"--kubeconfig={admin}", "--leader-elect=false",
                                     "--secure-port=0"], env),
        Component("containerd", [containerd_bin / "containerd", f"--config={containerd_config()}"], env),
    ]  # fmt: skip
    byname = {c.name: c for c in components}

    def on_signal(signum: int, _frame: object) -> None:
        STOP["signal"] = signum

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        t0 = time.monotonic()
        byname["etcd"].start()
        wait_for("etcd", lambda: http_ok(f"{etcd_url}/health"), 60, byname["etcd"])
        byname["kube-apiserver"].start()
        wait_for("kube-apiserver /readyz", lambda: https_ok(f"https://{NODE_IP}:{API_PORT}/readyz", pki / "ca.crt",
                 token), 120, byname["kube-apiserver"])  # fmt: skip
        for name in ("kube-controller-manager", "kube-scheduler", "containerd"):
            byname[name].start()
        ctr: list[str | os.PathLike[str]] = [
            containerd_bin / "ctr",
            f"--address={RUN / 'containerd.sock'}",
            "--namespace=k8s.io",
        ]
        wait_for("containerd", lambda: subprocess.run([*ctr, "version"], capture_output=True).returncode == 0, 60,
                 byname["containerd"])  # fmt: skip
        for archive, name in ((images / "pause.tar", PAUSE_IMAGE), (images / "operator.tar", IMAGE)):
            repository = name.rpartition(":")[0]  # the archive's own tag completes the name (tools/images.py)
            run(*ctr, "images", "import", f"--base-name={repository}", archive, env=env)
            if name not in run(*ctr, "images", "ls", "-q").split():
                raise SystemExit(f"node: {archive} did not import as {name}")
        cni_config()
        kubelet = Component("kubelet", [kube["kubelet"], f"--config={kubelet_config(pki / 'ca.crt')}",
                                        f"--kubeconfig={admin}", f"--hostname-override={NAME}",
                                        f"--node-ip={NODE_IP}", f"--root-dir={STATE / 'kubelet'}",
                                        f"--cert-dir={STATE / 'kubelet' / 'pki'}"], env)  # fmt: skip
        proxy = Component("kube-proxy", [kube["kube-proxy"], f"--config={kube_proxy_config(admin)}"], env)
        coredns = Component("coredns", [tool("coredns", "COREDNS_VERSION", "bin", "coredns"), "-conf",
                                        corefile(admin)], env)  # fmt: skip
        for component in (kubelet, proxy, coredns):
            component.start()
            byname[component.name] = component
        kubectl = ["kubectl", f"--kubeconfig={admin}"]
        wait_for("node Ready", lambda: "True" in run(*kubectl, "get", "node", NAME, "-o",
                 "jsonpath={.status.conditions[?(@.type=='Ready')].status}", check=False), 120, kubelet)  # fmt: skip
        wait_for("CoreDNS ready", lambda: http_ok("http://127.0.0.1:18181/ready"), 60, coredns)
        say(f"up in {time.monotonic() - t0:.1f} s: export KUBECONFIG={admin}")
        if ready_file is not None:
            write(ready_file, str(admin))
        while not STOP["signal"]:
            for component in byname.values():
                if component.popen is not None and component.popen.poll() is not None:
                    say(f"{component.name} exited ({component.popen.returncode}); tearing down:\n{component.tail()}")
                    return 1
            time.sleep(0.5)  # supervising: a signal or a component's exit ends the wait
        return 0
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        t0 = time.monotonic()
        down()
        say(f"down in {time.monotonic() - t0:.1f} s")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="node.py", description=__doc__.split("\n\n", 1)[0])
    sub = parser.add_subparsers(dest="command", required=True)
    up_parser = sub.add_parser("up", help="bring the node up and supervise it until signalled")
    up_parser.add_argument("--ready-file", type=Path, help="written with the admin kubeconfig's path once Ready")
    up_parser.add_argument("--images", type=Path, default=cache() / "images",
                           help="where tools/images.py wrote pause.tar and operator.tar")  # fmt: skip
    up_parser.add_argument("--wait-lock", action="store_true", help="wait for another node on this machine to end")
    up_parser.add_argument("--host-state", type=Path,
                           help="written with host_state() once the lock is held (before) and after teardown, "
                                "still under the lock (after): another node's changes show in neither")  # fmt: skip
    sub.add_parser("down", help="tear down whatever a previous node left (idempotent)")
    args = parser.parse_args(argv)
    if os.geteuid() != 0:
        raise SystemExit("node: must run as root (cgroups, the bridge, containerd)")
    with node_lock(wait=getattr(args, "wait_lock", False)):
        if args.command == "down":
            down()
            return 0
        record: Path | None = args.host_state
        if record is None:
            return up(args.ready_file, args.images)
        # A node killed outright (its supervisor SIGKILLed, the machine's session cut) left its bridge, mounts and
        # sysctls: clear them first, so the baseline is the host's own and not that node's leftovers, which ``up``
        # would clear anyway and the check would then report as this node's leak.
        down()
        before = host_state()
        write(record, json.dumps({"before": before}))
        try:
            return up(args.ready_file, args.images)
        finally:
            write(record, json.dumps({"before": before, "after": host_state()}))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
