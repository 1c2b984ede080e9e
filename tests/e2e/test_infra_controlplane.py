"""Proof that the real control plane works as the operator and chart tests need it: CRDs with CEL rules, watches,
RBAC for service accounts, and kubeconfigs that kubectl, both Python clients and kopf accept."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import uuid
from pathlib import Path
from typing import Any

import kubernetes
import kubernetes_asyncio
import pytest

from support.controlplane import ControlPlane
from support.processes import ManagedProcess, wait_until

pytestmark = pytest.mark.e2e

GROUP, VERSION, PLURAL = "infra-test.rolloutfleet.dev", "v1", "widgets"
CEL_MESSAGE = "minReplicas must not exceed maxReplicas"


def unique(prefix: str) -> str:
    """A fresh name: there is no namespace controller, so deleted namespaces never go away."""
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def widget_crd() -> dict[str, Any]:
    """A namespaced CRD with a structural schema and one CEL cross-field rule."""
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{PLURAL}.{GROUP}"},
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {"plural": PLURAL, "singular": "widget", "kind": "Widget"},
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "properties": {
                                "spec": {
                                    "type": "object",
                                    "required": ["minReplicas", "maxReplicas"],
                                    "properties": {
                                        "minReplicas": {"type": "integer", "minimum": 0},
                                        "maxReplicas": {"type": "integer", "minimum": 0},
                                    },
                                    "x-kubernetes-validations": [
                                        {"rule": "self.minReplicas <= self.maxReplicas", "message": CEL_MESSAGE},
                                    ],
                                }
                            },
                        }
                    },
                }
            ],
        },
    }


def widget(name: str, namespace: str, min_replicas: int, max_replicas: int) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "Widget",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"minReplicas": min_replicas, "maxReplicas": max_replicas},
    }


@pytest.fixture(scope="module")
def widgets_crd(control_plane: ControlPlane) -> str:
    """The Widget CRD, applied once and established."""
    control_plane.apply(widget_crd())
    control_plane.kubectl("wait", "--for=condition=Established", f"crd/{PLURAL}.{GROUP}", "--timeout=60s")
    return f"{PLURAL}.{GROUP}"


def test_cel_rule_rejects_invalid_object_with_its_message_and_accepts_valid_one(
    control_plane: ControlPlane, widgets_crd: str
) -> None:
    namespace = control_plane.create_namespace(unique("cel"))

    with pytest.raises(subprocess.CalledProcessError) as rejected:
        control_plane.apply(widget("inverted", namespace, min_replicas=3, max_replicas=1))
    assert CEL_MESSAGE in rejected.value.stderr

    control_plane.apply(widget("sane", namespace, min_replicas=1, max_replicas=3))
    stored = control_plane.kubectl_json("get", widgets_crd, "sane", f"--namespace={namespace}")
    assert stored["spec"] == {"minReplicas": 1, "maxReplicas": 3}
    assert stored["metadata"]["resourceVersion"]


async def test_watch_sees_added_modified_and_deleted_events(control_plane: ControlPlane, widgets_crd: str) -> None:
    """Writes go through the official sync client, the watch through kubernetes_asyncio: both read the kubeconfig."""
    namespace = control_plane.create_namespace(unique("watch"))
    sync_api = kubernetes.client.CustomObjectsApi(
        kubernetes.config.new_client_from_config(config_file=str(control_plane.kubeconfig))
    )
    sync_api.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, widget("w1", namespace, 1, 2))

    seen: list[tuple[str, str]] = []
    async with await kubernetes_asyncio.config.new_client_from_config(
        config_file=str(control_plane.kubeconfig)
    ) as api_client:
        api = kubernetes_asyncio.client.CustomObjectsApi(api_client)
        watch = kubernetes_asyncio.watch.Watch()
        async with watch.stream(
            api.list_namespaced_custom_object, GROUP, VERSION, namespace, PLURAL, timeout_seconds=60
        ) as stream:
            async for event in stream:
                seen.append((event["type"], event["object"]["metadata"]["name"]))
                if event["type"] == "ADDED":
                    sync_api.patch_namespaced_custom_object(
                        GROUP, VERSION, namespace, PLURAL, "w1", {"spec": {"maxReplicas": 5}}
                    )
                elif event["type"] == "MODIFIED":
                    assert event["object"]["spec"]["maxReplicas"] == 5
                    sync_api.delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "w1")
                elif event["type"] == "DELETED":
                    watch.stop()
    assert seen == [("ADDED", "w1"), ("MODIFIED", "w1"), ("DELETED", "w1")]


def test_service_account_is_forbidden_without_a_role_and_allowed_with_one(control_plane: ControlPlane) -> None:
    namespace = control_plane.create_namespace(unique("rbac"))
    sa_kubeconfig = control_plane.service_account_kubeconfig(namespace, "reader")
    who = f"--as=system:serviceaccount:{namespace}:reader"

    denied = control_plane.kubectl("auth", "can-i", "list", "configmaps", f"--namespace={namespace}", who, check=False)
    assert (denied.returncode, denied.stdout.strip()) == (1, "no")
    forbidden = control_plane.kubectl(
        "get", "configmaps", f"--namespace={namespace}", kubeconfig=sa_kubeconfig, check=False
    )
    assert forbidden.returncode != 0
    assert "forbidden" in forbidden.stderr.lower()

    control_plane.kubectl(
        "create",
        "role",
        "configmap-reader",
        "--verb=get,list,watch",
        "--resource=configmaps",
        f"--namespace={namespace}",
    )
    control_plane.kubectl(
        "create",
        "rolebinding",
        "reader",
        "--role=configmap-reader",
        f"--serviceaccount={namespace}:reader",
        f"--namespace={namespace}",
    )

    # The RBAC authorizer reads from an informer cache: the binding takes effect within moments, not synchronously.
    wait_until(
        lambda: (
            control_plane.kubectl(
                "auth", "can-i", "list", "configmaps", f"--namespace={namespace}", who, check=False
            ).returncode
            == 0
        ),
        timeout=30,
        what="RBAC binding",
    )
    allowed = control_plane.kubectl(
        "get", "configmaps", f"--namespace={namespace}", "-o", "name", kubeconfig=sa_kubeconfig
    )
    assert allowed.returncode == 0
    impersonated = control_plane.impersonation_kubeconfig(f"system:serviceaccount:{namespace}:reader")
    assert (
        control_plane.kubectl(
            "auth", "can-i", "delete", "configmaps", f"--namespace={namespace}", kubeconfig=impersonated, check=False
        ).stdout.strip()
        == "no"
    )


def test_kopf_operator_logs_in_from_kubeconfig_and_handles_an_object(
    control_plane: ControlPlane, tmp_path: Path
) -> None:
    namespace = control_plane.create_namespace(unique("kopf"))
    handlers = tmp_path / "handlers.py"
    handlers.write_text(
        textwrap.dedent("""
        import kopf

        @kopf.on.create("configmaps")
        def mark(patch: kopf.Patch, **_: object) -> None:
            patch.metadata.annotations["infra-test/handled"] = "yes"
    """)
    )
    operator = ManagedProcess(
        "kopf",
        [sys.executable, "-m", "kopf", "run", "--standalone", f"--namespace={namespace}", str(handlers)],
        tmp_path / "kopf.log",
        env=control_plane.env(),
    )
    operator.start()
    try:
        control_plane.kubectl("create", "configmap", "probe", f"--namespace={namespace}")
        waited = control_plane.kubectl(
            "wait",
            "configmap/probe",
            f"--namespace={namespace}",
            "--timeout=60s",
            "--for=jsonpath={.metadata.annotations.infra-test/handled}=yes",
            check=False,
        )
        assert waited.returncode == 0, f"{waited.stderr}\nkopf log:\n{operator.tail()}"
    finally:
        operator.stop()


def test_apiserver_restart_keeps_data_and_credentials(control_plane: ControlPlane) -> None:
    namespace = control_plane.create_namespace(unique("restart"))
    control_plane.kubectl("create", "configmap", "kept", "--from-literal=k=v", f"--namespace={namespace}")

    control_plane.restart_etcd()
    control_plane.restart_apiserver()

    kept = control_plane.kubectl_json("get", "configmap", "kept", f"--namespace={namespace}")
    assert kept["data"] == {"k": "v"}
