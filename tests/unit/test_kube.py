"""The shared Kubernetes vocabulary: which API errors are transient, and where credentials come from."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import aiohttp
import pytest
import yaml
from kubernetes_asyncio.client.exceptions import ApiException
from kubernetes_asyncio.config import ConfigException, incluster_config, kube_config

from rollout_runtime.failures import http_status_is_infra
from rollout_runtime.kube.config import load_client_configuration
from rollout_runtime.kube.errors import api_error_is_transient


def test_an_api_answer_is_transient_exactly_when_its_status_is_the_servers_weather() -> None:
    """Every HTTP status follows the runtime's one retriable-status table (5xx, 408, 425, 429)."""
    wrong = [s for s in range(100, 600) if api_error_is_transient(ApiException(status=s)) != http_status_is_infra(s)]
    assert wrong == []


@pytest.mark.parametrize(
    ("exc", "transient"),
    [
        (ApiException(status=0, reason="Cannot prepare a request message"), False),  # the client's own bug
        (ApiException(status=None, reason="a watch ERROR event without a code"), False),
        (aiohttp.ClientConnectionError("refused"), True),
        (aiohttp.ServerDisconnectedError(), True),
        (ConnectionResetError(), True),
        (TimeoutError(), True),
        (aiohttp.InvalidURL("https//nowhere"), False),  # a ClientError, but the kubeconfig's fault
        (ValueError("not an API error"), False),
    ],
    ids=["status-0", "status-none", "refused", "disconnected", "reset", "timeout", "invalid-url", "other"],
)
def test_errors_without_a_usable_status(exc: BaseException, transient: bool) -> None:
    assert api_error_is_transient(exc) is transient


def test_importing_the_kind_names_loads_no_client() -> None:
    code = "import sys, rollout_runtime.kube.kinds\nprint('kubernetes_asyncio' in sys.modules)\n"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert done.stdout.strip() == "False"


def _kubeconfig(path: Path, server: str) -> Path:
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": server}}],
                "users": [{"name": "u", "user": {"token": "t"}}],
                "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "x",
            }
        )
    )
    return path


@pytest.fixture
def default_kubeconfig(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """What ``$KUBECONFIG`` / ``~/.kube/config`` would name (read once, at import, by kubernetes_asyncio)."""
    path = _kubeconfig(tmp_path / "default-kubeconfig", "https://default.example:6443")
    monkeypatch.setattr(kube_config, "KUBE_CONFIG_DEFAULT_LOCATION", str(path))
    return path


@pytest.fixture
def service_account(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A pod's environment and service account mount, token and CA in ``tmp_path/sa``."""
    mount = tmp_path / "sa"
    mount.mkdir()
    (mount / "token").write_text("sa-token")
    (mount / "ca.crt").write_text("not checked until a request is made")
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    monkeypatch.setattr(incluster_config, "SERVICE_TOKEN_FILENAME", str(mount / "token"))
    monkeypatch.setattr(incluster_config, "SERVICE_CERT_FILENAME", str(mount / "ca.crt"))
    return mount


async def test_an_explicit_kubeconfig_wins_over_the_service_account_and_the_default(
    tmp_path: Path, service_account: Path, default_kubeconfig: Path
) -> None:
    explicit = _kubeconfig(tmp_path / "explicit", "https://explicit.example:6443")
    assert (await load_client_configuration(explicit)).host == "https://explicit.example:6443"


async def test_a_mounted_service_account_wins_over_the_default_kubeconfig(
    service_account: Path, default_kubeconfig: Path
) -> None:
    assert (await load_client_configuration()).host == "https://10.0.0.1:443"


async def test_a_pod_without_a_token_falls_back_to_the_default_kubeconfig(
    service_account: Path, default_kubeconfig: Path
) -> None:
    (service_account / "token").unlink()
    assert (await load_client_configuration()).host == "https://default.example:6443"


async def test_no_credentials_anywhere_names_both_reasons(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setattr(kube_config, "KUBE_CONFIG_DEFAULT_LOCATION", str(tmp_path / "absent"))
    with pytest.raises(ConfigException, match=r"no in-cluster service account \(Service host/port is not set"):
        await load_client_configuration()
