"""A real Kubernetes control plane (etcd + kube-apiserver) for end-to-end tests, without Docker or a kubelet.

Why real: CRD structural schemas, CEL rules, RBAC, watches and server-side apply behave as users see them only on
the real apiserver. Everything listens on 127.0.0.1 ports picked at start, keeps its data and logs in a temp dir
(kept by pytest after the run), and is stopped by pid. There is no controller-manager, scheduler or kubelet: objects
are stored and served but nothing reconciles them (no pods run, namespaces stay Terminating once deleted, and
namespaces get no ``default`` service account).

Identities:
- admin: a static bearer token in group ``system:masters`` (``.token``, ``.kubeconfig``).
- service accounts: real TokenRequest tokens (signing keys generated at start), see
  :meth:`ControlPlane.service_account_kubeconfig`; or impersonation (``kubectl --as=system:serviceaccount:NS:NAME``,
  :meth:`ControlPlane.impersonation_kubeconfig`).
"""

from __future__ import annotations

import json
import os
import secrets
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from support.processes import ManagedProcess, free_ports, wait_until
from support.tools import openssl_path, tool_path

START_TIMEOUT = 90.0  # seconds; a warm start takes a few seconds, a cold page cache on 2 cores much longer
SERVICE_ACCOUNT_ISSUER = "https://kubernetes.default.svc.cluster.local"


class ControlPlane:
    """etcd + kube-apiserver on 127.0.0.1, with an admin kubeconfig; restartable with its data kept."""

    def __init__(self, workdir: Path, extra_apiserver_args: Sequence[str] = ()) -> None:
        self.workdir = workdir
        self.certs_dir = workdir / "pki"
        self.logs_dir = workdir / "logs"
        self.kubeconfigs_dir = workdir / "kubeconfigs"
        self.host = "127.0.0.1"
        self.token = secrets.token_hex(24)
        self.ca_file = self.certs_dir / "ca.crt"
        self.kubeconfig = self.kubeconfigs_dir / "admin.kubeconfig"
        self.start_seconds: float | None = None
        self._extra_apiserver_args = list(extra_apiserver_args)
        self._ssl_context: ssl.SSLContext | None = None
        self.etcd = ManagedProcess("etcd", [], self.logs_dir / "etcd.log")
        self.apiserver = ManagedProcess("kube-apiserver", [], self.logs_dir / "kube-apiserver.log")
        self._assign_ports()

    # --- lifecycle -------------------------------------------------------------------------------------------

    def start(self, attempts: int = 3) -> None:
        """Generate credentials (first time only), start etcd then the apiserver, and wait until both are ready.

        A free port can be taken by another process between picking it and binding it (parallel sessions share
        this machine): the first start then retries on new ports. Restarts keep their ports.
        """
        started = time.monotonic()
        first = not self.ca_file.exists()
        if first:
            self._generate_credentials()
        for attempt in range(1, attempts + 1):
            try:
                self.start_etcd()
                self.start_apiserver()
                break
            except RuntimeError:
                self.stop()
                port_taken = "address already in use" in self.etcd.tail(200) + self.apiserver.tail(200)
                if not (first and port_taken and attempt < attempts):
                    raise
                self._assign_ports()
                self._write_kubeconfig(self.kubeconfig, user="admin", credentials={"token": self.token})
        self.start_seconds = time.monotonic() - started

    def stop(self) -> None:
        """Stop the apiserver, then etcd (each by pid). Idempotent; data and logs stay in the workdir."""
        self.apiserver.stop()
        self.etcd.stop()

    def start_etcd(self) -> None:
        """Start etcd on its fixed ports with the existing data dir, and wait for /health."""
        self.etcd.start()
        wait_until(self._etcd_healthy, timeout=START_TIMEOUT, what="etcd", process=self.etcd)

    def stop_etcd(self) -> None:
        """Stop etcd gracefully; the apiserver keeps running, unready. Takes ~7 s while the apiserver is connected:
        etcd drains its gRPC streams (the apiserver's watches) for up to its request timeout."""
        self.etcd.stop()

    def kill_etcd(self) -> None:
        """SIGKILL etcd (a crash: no graceful close of the apiserver's watches, so it is also the fast way down)."""
        self.etcd.kill()

    def restart_etcd(self) -> None:
        """Stop and start etcd, keeping its data."""
        self.stop_etcd()
        self.start_etcd()

    def start_apiserver(self) -> None:
        """Start the apiserver on its fixed port and wait for /readyz and the default namespace."""
        self.apiserver.start()
        wait_until(
            lambda: self._get("/readyz") == 200,
            timeout=START_TIMEOUT,
            what="kube-apiserver /readyz",
            process=self.apiserver,
        )
        wait_until(
            lambda: self._get("/api/v1/namespaces/default") == 200,
            timeout=START_TIMEOUT,
            what="namespace default",
            process=self.apiserver,
        )

    def stop_apiserver(self) -> None:
        """Stop the apiserver gracefully; etcd and its data stay."""
        self.apiserver.stop()

    def kill_apiserver(self) -> None:
        """SIGKILL the apiserver (a crash rather than a graceful shutdown)."""
        self.apiserver.kill()

    def restart_apiserver(self) -> None:
        """Stop and start the apiserver on the same port; kubeconfigs and tokens stay valid."""
        self.stop_apiserver()
        self.start_apiserver()

    def __enter__(self) -> ControlPlane:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # --- clients ---------------------------------------------------------------------------------------------

    def env(self, kubeconfig: Path | None = None) -> dict[str, str]:
        """The current environment with KUBECONFIG pointing at this cluster (for kubectl, helm, kopf, clients)."""
        return {**os.environ, "KUBECONFIG": str(kubeconfig or self.kubeconfig)}

    def kubectl(
        self,
        *args: str,
        input: str | None = None,
        check: bool = True,
        kubeconfig: Path | None = None,
        timeout: float = 60.0,
    ) -> subprocess.CompletedProcess[str]:
        """Run kubectl against this cluster (admin unless ``kubeconfig`` is given); raise with stderr on failure."""
        argv = [str(tool_path("kubectl")), f"--kubeconfig={kubeconfig or self.kubeconfig}", *args]
        result = subprocess.run(
            argv, input=input, capture_output=True, text=True, timeout=timeout, env=self.env(kubeconfig)
        )
        if check and result.returncode != 0:
            raise subprocess.CalledProcessError(result.returncode, argv, result.stdout, result.stderr)
        return result

    def kubectl_json(self, *args: str, kubeconfig: Path | None = None) -> Any:
        """Run a kubectl command that prints one object (``-o json`` is added) and parse it."""
        return json.loads(self.kubectl(*args, "-o", "json", kubeconfig=kubeconfig).stdout)

    def apply(self, *manifests: dict[str, Any], namespace: str | None = None) -> None:
        """kubectl apply the given objects (as a List) with the admin identity."""
        args = ["apply", "-f", "-"] + ([f"--namespace={namespace}"] if namespace else [])
        self.kubectl(*args, input=json.dumps({"apiVersion": "v1", "kind": "List", "items": list(manifests)}))

    def create_namespace(self, name: str) -> str:
        """Create a namespace and return its name (there is no namespace controller: never reuse names)."""
        self.kubectl("create", "namespace", name)
        return name

    def service_account_kubeconfig(
        self, namespace: str, name: str, *, create: bool = True, duration: str = "3600s"
    ) -> Path:
        """A kubeconfig authenticating as the service account with a real TokenRequest token (created if asked)."""
        if create:
            metadata = {"name": name, "namespace": namespace}
            self.apply({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": metadata})
        token = self.kubectl("create", "token", name, f"--namespace={namespace}", f"--duration={duration}").stdout
        path = self.kubeconfigs_dir / f"sa-{namespace}-{name}.kubeconfig"
        self._write_kubeconfig(
            path,
            user=f"system:serviceaccount:{namespace}:{name}",
            credentials={"token": token.strip()},
            namespace=namespace,
        )
        return path

    def impersonation_kubeconfig(self, user: str, groups: Sequence[str] = ()) -> Path:
        """An admin kubeconfig impersonating ``user``: kubectl and helm honour ``as``, the Python clients do not."""
        path = self.kubeconfigs_dir / f"as-{user.replace(':', '_')}.kubeconfig"
        credentials: dict[str, Any] = {"token": self.token, "as": user}
        if groups:
            credentials["as-groups"] = list(groups)
        self._write_kubeconfig(path, user=user, credentials=credentials)
        return path

    def logs(self, lines: int = 40) -> str:
        """Paths and last lines of both logs: printed when a test that used the control plane fails."""
        return "\n".join(
            f"--- {proc.name} (pid {proc.pid}, {'running' if proc.running else 'stopped'}) log: {proc.log_path}\n"
            f"{proc.tail(lines)}"
            for proc in (self.etcd, self.apiserver)
        )

    # --- internals -------------------------------------------------------------------------------------------

    def _assign_ports(self) -> None:
        """Pick free ports and derive the URLs and command lines from them."""
        self.etcd_port, self.etcd_peer_port, self.port = free_ports(3)
        self.url = f"https://{self.host}:{self.port}"
        self.etcd_url = f"http://{self.host}:{self.etcd_port}"
        self.etcd.argv = self._etcd_argv()
        self.apiserver.argv = self._apiserver_argv()

    def _etcd_argv(self) -> list[str]:
        peer = f"http://{self.host}:{self.etcd_peer_port}"
        return [
            str(tool_path("etcd")),
            "--name=test",
            f"--data-dir={self.workdir / 'etcd-data'}",
            f"--listen-client-urls={self.etcd_url}",
            f"--advertise-client-urls={self.etcd_url}",
            f"--listen-peer-urls={peer}",
            f"--initial-advertise-peer-urls={peer}",
            f"--initial-cluster=test={peer}",
            "--log-level=warn",
            "--unsafe-no-fsync",  # test data: durability across machine crashes is not needed, speed is
        ]

    def _apiserver_argv(self) -> list[str]:
        return [
            str(tool_path("kube-apiserver")),
            f"--etcd-servers={self.etcd_url}",
            f"--bind-address={self.host}",
            f"--advertise-address={self.host}",
            f"--secure-port={self.port}",
            f"--cert-dir={self.certs_dir}",
            f"--tls-cert-file={self.certs_dir / 'apiserver.crt'}",
            f"--tls-private-key-file={self.certs_dir / 'apiserver.key'}",
            f"--token-auth-file={self.certs_dir / 'tokens.csv'}",
            "--authorization-mode=Node,RBAC",
            f"--service-account-issuer={SERVICE_ACCOUNT_ISSUER}",
            f"--service-account-key-file={self.certs_dir / 'sa.pub'}",
            f"--service-account-signing-key-file={self.certs_dir / 'sa.key'}",
            "--service-cluster-ip-range=10.96.0.0/24",  # only allocated in etcd: there is no service network here
            "--profiling=false",
            *self._extra_apiserver_args,
        ]

    def _generate_credentials(self) -> None:
        """A CA, a serving cert for 127.0.0.1/localhost, a service-account signing key and the admin token file."""
        self.certs_dir.mkdir(parents=True, exist_ok=True)
        d = self.certs_dir
        ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
        self._openssl(
            "req",
            "-x509",
            *ec,
            "-keyout",
            d / "ca.key",
            "-out",
            d / "ca.crt",
            "-days",
            "3650",
            "-subj",
            "/CN=rollout-fleet-test-ca",
            "-addext",
            "basicConstraints=critical,CA:TRUE",
            "-addext",
            "keyUsage=critical,keyCertSign,cRLSign",
        )
        self._openssl(
            "req",
            "-new",
            *ec,
            "-keyout",
            d / "apiserver.key",
            "-out",
            d / "apiserver.csr",
            "-subj",
            "/CN=kube-apiserver",
        )
        (d / "apiserver.ext").write_text(
            "subjectAltName=IP:127.0.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,"
            "DNS:kubernetes.default.svc\n"
            "basicConstraints=critical,CA:FALSE\n"
            "keyUsage=critical,digitalSignature,keyEncipherment\n"
            "extendedKeyUsage=serverAuth\n"
            "subjectKeyIdentifier=hash\n"
            "authorityKeyIdentifier=keyid,issuer\n"
        )
        self._openssl(
            "x509",
            "-req",
            "-in",
            d / "apiserver.csr",
            "-CA",
            d / "ca.crt",
            "-CAkey",
            d / "ca.key",
            "-CAcreateserial",
            "-out",
            d / "apiserver.crt",
            "-days",
            "3650",
            "-extfile",
            d / "apiserver.ext",
        )
        self._openssl("genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", d / "sa.key")
        self._openssl("pkey", "-in", d / "sa.key", "-pubout", "-out", d / "sa.pub")
        (d / "tokens.csv").write_text(f'{self.token},admin,admin-uid,"system:masters"\n')
        self._write_kubeconfig(self.kubeconfig, user="admin", credentials={"token": self.token})

    def _openssl(self, *args: str | os.PathLike[str]) -> None:
        argv = [str(openssl_path()), *(os.fspath(a) for a in args)]
        result = subprocess.run(argv, capture_output=True, text=True, timeout=60)
        if result.returncode != 0:
            raise RuntimeError(f"openssl failed: {' '.join(argv)}\n{result.stderr}")

    def _write_kubeconfig(
        self, path: Path, *, user: str, credentials: dict[str, Any], namespace: str = "default"
    ) -> None:
        """JSON is valid YAML: kubectl, helm, kopf and both Python clients read this file."""
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "rollout-fleet-test",
                    "cluster": {"server": self.url, "certificate-authority": str(self.ca_file)},
                }
            ],
            "users": [{"name": user, "user": credentials}],
            "contexts": [
                {"name": "test", "context": {"cluster": "rollout-fleet-test", "user": user, "namespace": namespace}}
            ],
            "current-context": "test",
        }
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(config, indent=2))
        path.chmod(0o600)

    def _etcd_healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.etcd_url}/health", timeout=2) as response:
                return bool(json.load(response).get("health") == "true")
        except (OSError, ValueError):
            return False

    def _get(self, path: str) -> int:
        """GET a path as admin; the HTTP status, or 0 when the connection fails."""
        if self._ssl_context is None:
            self._ssl_context = ssl.create_default_context(cafile=str(self.ca_file))
        request = urllib.request.Request(self.url + path, headers={"Authorization": f"Bearer {self.token}"})
        try:
            with urllib.request.urlopen(request, timeout=5, context=self._ssl_context) as response:
                return int(response.status)
        except urllib.error.HTTPError as exc:
            return int(exc.code)
        except OSError:
            return 0


_ACTIVE: list[ControlPlane] = []


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "e2e: needs the real kube-apiserver + etcd (the control_plane fixture)")


@pytest.fixture(scope="session")
def control_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    """One real etcd + kube-apiserver for the session; its logs stay in pytest's temp dir after the run."""
    plane = ControlPlane(tmp_path_factory.mktemp("controlplane"))
    _ACTIVE.append(plane)
    try:
        plane.start()
        yield plane
    finally:
        plane.stop()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """When a test that used the control plane fails, attach the paths and tails of its logs to the report."""
    report = yield
    if report.failed and _ACTIVE and "control_plane" in getattr(item, "fixturenames", ()):
        report.sections.append(("control plane logs", _ACTIVE[-1].logs()))
    return report


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """Report how long the control plane took to start: the number docs/testing.md quotes."""
    for plane in _ACTIVE:
        if plane.start_seconds is not None:
            terminalreporter.write_line(
                f"control plane: etcd + kube-apiserver ready in {plane.start_seconds:.1f} s ({plane.workdir})"
            )
