"""examples/: what `kubectl apply -f examples/` creates is complete and valid, checked without a cluster.

Every Kubernetes object validates against the API schema of the Kubernetes version the tests run; every
GenerationShard/EnvironmentServer serviceRef names a Service the directory creates, on a port it exposes, whose
selector picks a Deployment's pods on the port the container listens on; the simulated shards serve exactly the model
and context length their GenerationShards declare (the operator checks /v1/models); and each container's arguments
parse as the ``rollout-fleet`` subcommand they name (the operator image's entrypoint). The e2e test
(tests/e2e/test_examples_quickstart.py) applies the same files to a real kube-apiserver and runs the containers'
commands.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from rollout_runtime.cli import cli
from rollout_runtime.kube.api import EnvironmentServerSpec, GenerationShardSpec, RolloutFleetSpec
from support.tools import REPO_ROOT

EXAMPLES = REPO_ROOT / "examples"
KUBERNETES_VERSION = "1.35"
OUR_KINDS = {"GenerationShard": GenerationShardSpec, "EnvironmentServer": EnvironmentServerSpec,
             "RolloutFleet": RolloutFleetSpec}  # fmt: skip


def documents(*paths: Path) -> list[dict[str, Any]]:
    return [doc for path in paths for doc in yaml.safe_load_all(path.read_text()) if doc]


def applied() -> list[dict[str, Any]]:
    """What `kubectl apply -f examples/` applies: the directory's YAML files, not its subdirectories."""
    return documents(*sorted(EXAMPLES.glob("*.yaml")))


def gpu_variant() -> list[dict[str, Any]]:
    return documents(*sorted((EXAMPLES / "vllm").glob("*.yaml")))


def of_kind(docs: list[dict[str, Any]], kind: str) -> dict[str, dict[str, Any]]:
    return {doc["metadata"]["name"]: doc for doc in docs if doc["kind"] == kind}


def containers(deployment: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield from deployment["spec"]["template"]["spec"]["containers"]


def option(args: list[str], name: str) -> str:
    return args[args.index(name) + 1]


def chart_image() -> str:
    chart = yaml.safe_load((REPO_ROOT / "charts" / "rollout-fleet" / "Chart.yaml").read_text())
    values = yaml.safe_load((REPO_ROOT / "charts" / "rollout-fleet" / "values.yaml").read_text())
    return f"{values['image']['repository']}:{values['image']['tag'] or chart['appVersion']}"


@pytest.mark.parametrize("variant", ["applied", "vllm"])
def test_every_kubernetes_object_validates_against_the_api_schema(variant: str) -> None:
    docs = applied() if variant == "applied" else gpu_variant()
    assert docs
    for doc in docs:
        if doc["kind"] in OUR_KINDS:
            OUR_KINDS[doc["kind"]].model_validate(doc["spec"])  # the CRDs are generated from these models
        else:
            kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)


@pytest.mark.parametrize("variant", ["applied", "vllm"])
def test_every_service_ref_reaches_a_container_port_through_a_service(variant: str) -> None:
    docs = applied()
    if variant == "vllm":  # the GPU shards replace the simulated ones (same Services)
        replaced = {doc["metadata"]["name"] for doc in gpu_variant()}
        docs = [d for d in docs if d["kind"] in OUR_KINDS or d["metadata"]["name"] not in replaced] + gpu_variant()
    services, deployments = of_kind(docs, "Service"), of_kind(docs, "Deployment")
    refs = [doc for kind in ("GenerationShard", "EnvironmentServer") for doc in of_kind(docs, kind).values()]
    assert len(refs) == 3
    for target in refs:
        ref = target["spec"]["serviceRef"]
        service = services.get(ref["name"])
        assert service is not None, f"{target['metadata']['name']}: no Service {ref['name']} in examples/"
        [port] = [p for p in service["spec"]["ports"] if p["port"] == ref.get("port", 80)]
        selector = service["spec"]["selector"]
        backends = [
            d for d in deployments.values() if selector.items() <= d["spec"]["template"]["metadata"]["labels"].items()
        ]
        assert len(backends) == 1, f"Service {ref['name']} selects {len(backends)} Deployments"
        names = {p.get("name"): p["containerPort"] for c in containers(backends[0]) for p in c.get("ports", [])}
        assert port["targetPort"] in names, f"Service {ref['name']} targets a port no container names"


def test_simulated_shards_serve_the_model_and_context_length_their_generation_shards_declare() -> None:
    docs = applied()
    services, deployments = of_kind(docs, "Service"), of_kind(docs, "Deployment")
    for name, shard in of_kind(docs, "GenerationShard").items():
        selector = services[shard["spec"]["serviceRef"]["name"]]["spec"]["selector"]
        [deployment] = [
            d for d in deployments.values() if selector.items() <= d["spec"]["template"]["metadata"]["labels"].items()
        ]
        [container] = containers(deployment)
        args = container["args"]
        assert args[0] == "sim-shard", f"{name}: `kubectl apply -f examples/` must work without GPUs"
        assert option(args, "--model") == shard["spec"]["model"], name
        assert int(option(args, "--max-model-len")) == shard["spec"]["maxModelLen"], name
        assert option(args, "--host") == "0.0.0.0", f"{name}: bind all interfaces, or the Service cannot reach it"


def test_gpu_shards_are_real_vllm_asking_for_a_gpu_and_match_the_same_generation_shards() -> None:
    shards = of_kind(applied(), "GenerationShard")
    for name, deployment in of_kind(gpu_variant(), "Deployment").items():
        [container] = containers(deployment)
        assert container["image"].startswith("vllm/vllm-openai:"), name
        assert container["resources"]["limits"]["nvidia.com/gpu"] == "1", name
        [shard] = [s for s in shards.values() if s["spec"]["serviceRef"]["name"] == name]
        assert option(container["args"], "--model") == shard["spec"]["model"], name
        assert int(option(container["args"], "--max-model-len")) == shard["spec"]["maxModelLen"], name
    assert "NEEDS GPUs" in (EXAMPLES / "vllm" / "vllm-shards.yaml").read_text()


def test_containers_run_the_operator_image_and_their_arguments_parse_as_rollout_fleet_subcommands() -> None:
    image = chart_image()
    deployments = of_kind(applied(), "Deployment")
    assert set(deployments) == {"vllm-0", "vllm-1", "verifier"}
    for name, deployment in deployments.items():
        for container in containers(deployment):
            assert container["image"] == image, f"{name}: use the chart's operator image {image}"
            subcommand, *args = container["args"]
            command = cli.get_command(None, subcommand)  # type: ignore[arg-type]
            assert command is not None, f"{name}: rollout-fleet has no subcommand {subcommand!r}"
            with command.make_context(subcommand, list(args)) as ctx:
                port = ctx.params["port"]
            assert [p["containerPort"] for p in container["ports"]] == [port], name


def test_containers_run_as_the_images_non_root_user_with_a_read_only_root() -> None:
    for name, deployment in of_kind(applied(), "Deployment").items():
        pod = deployment["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True, name
        assert pod["securityContext"]["runAsUser"] == 65532, name
        for container in containers(deployment):
            assert container["securityContext"]["readOnlyRootFilesystem"] is True, name
            assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}, name
            assert "memory" in container["resources"]["limits"], name


# --- examples/pods/: fleets that select pods ---------------------------------------------------------------------


def pod_examples() -> dict[str, list[dict[str, Any]]]:
    return {path.name: documents(path) for path in sorted((EXAMPLES / "pods").glob("*.yaml"))}


def pod_templates(doc: dict[str, Any]) -> list[tuple[dict[str, str], dict[str, Any]]]:
    """(labels the pods get, pod spec) of a Deployment, or of a LeaderWorkerSet's leader (with LWS's own labels)."""
    if doc["kind"] == "Deployment":
        template = doc["spec"]["template"]
        return [(template["metadata"]["labels"], template["spec"])]
    assert doc["kind"] == "LeaderWorkerSet"
    lws = doc["spec"]["leaderWorkerTemplate"]
    added = {
        "leaderworkerset.sigs.k8s.io/name": doc["metadata"]["name"],
        "leaderworkerset.sigs.k8s.io/worker-index": "0",
    }
    return [({**lws["leaderTemplate"]["metadata"]["labels"], **added}, lws["leaderTemplate"]["spec"])]


def test_pod_examples_validate_and_each_fleet_selects_pods_serving_its_target_port() -> None:
    from fleet_operator.decisions import selector_matches

    examples = pod_examples()
    assert set(examples) == {"sim-replicas.yaml", "vllm-deployment.yaml", "vllm-leaderworkerset.yaml"}
    for name, docs in examples.items():
        fleets = [RolloutFleetSpec.model_validate(d["spec"]) for d in docs if d["kind"] == "RolloutFleet"]
        assert len(fleets) == 1, name
        (fleet,) = fleets
        assert fleet.shard_pods is not None
        assert fleet.shard_pods.selector is not None
        workloads = [d for d in docs if d["kind"] in ("Deployment", "LeaderWorkerSet")]
        assert workloads, name
        for doc in docs:
            if doc["kind"] in ("Deployment", "Service"):
                kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)
        selected = [(labels, spec) for w in workloads for labels, spec in pod_templates(w)
                    if selector_matches(fleet.shard_pods.selector, labels)]  # fmt: skip
        assert selected, f"{name}: the fleet selects no pod template"
        for _, spec in selected:
            ports = {p["name"] for c in spec["containers"] for p in c.get("ports", [])}
            assert fleet.shard_pods.target_port.name in ports, name


def test_the_vllm_pod_examples_run_the_real_server_with_the_fleets_model_on_gpus() -> None:
    for name in ("vllm-deployment.yaml", "vllm-leaderworkerset.yaml"):
        docs = pod_examples()[name]
        (fleet,) = [RolloutFleetSpec.model_validate(d["spec"]) for d in docs if d["kind"] == "RolloutFleet"]
        assert fleet.shard_pods is not None
        (workload,) = [d for d in docs if d["kind"] in ("Deployment", "LeaderWorkerSet")]
        for _, spec in pod_templates(workload):
            (container,) = spec["containers"]
            assert container["image"].startswith("vllm/vllm-openai:")
            command = " ".join(container.get("command", []) + container["args"])
            assert fleet.shard_pods.model in command
            assert f"--max-model-len {fleet.shard_pods.max_model_len}" in command
            assert container["readinessProbe"]["httpGet"]["path"] == "/health"
            assert "nvidia.com/gpu" in container["resources"]["limits"]
