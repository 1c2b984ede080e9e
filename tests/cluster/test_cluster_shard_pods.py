"""The cluster tier, pods as fleet members: discovery, restarts and refits, drains, the router, RBAC and metrics.

One ``helm upgrade`` of the tier's release (conftest.py) lists the node's pod network on the probe allowlist and
enables the chart's router for the demo fleet; then ``examples/pods/sim-replicas.yaml`` (pods selected by label, as
docs/operator.md applies it) and a Deployment behind a Service whose EndpointSlices a second fleet follows. Every
fault is real and proven to have hit: a container SIGKILLed on the host (restart count +1, exit code 137), a pod
deleted with a grace period (deletionTimestamp, its container still running in its preStop), a shard scaled away
(its Service has no endpoint).
"""

from __future__ import annotations

import json
import textwrap
import urllib.error
import urllib.request
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest

import node as node_tool  # tools/node.py
from support.cluster import OPERATOR, ROUTER, Installed, is_ready, sigkill_until_restarted, until
from support.prometheus import PrometheusFactory
from support.tools import REPO_ROOT

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(900)]

REPLICAS = "app.kubernetes.io/name=sim-replicas"
"""examples/pods/sim-replicas.yaml's pods, which its RolloutFleet ``replicas`` selects by label."""
SERVED = "app.kubernetes.io/name=sim-served"
"""The pods behind Service ``sim-served``, whose EndpointSlices RolloutFleet ``served`` follows."""
PRESTOP_SECONDS = 30
"""sim-served's preStop: the window in which a terminating pod still serves, Draining, before its SIGTERM."""
SERVED_MANIFEST = f"""
apiVersion: apps/v1
kind: Deployment
metadata: {{name: sim-served}}
spec:
  replicas: 2
  selector: {{matchLabels: {{app.kubernetes.io/name: sim-served}}}}
  template:
    metadata: {{labels: {{app.kubernetes.io/name: sim-served}}}}
    spec:
      automountServiceAccountToken: false
      terminationGracePeriodSeconds: {PRESTOP_SECONDS + 30}
      securityContext: {{runAsNonRoot: true, runAsUser: 65532, runAsGroup: 65532}}
      containers:
        - name: shard
          image: {node_tool.IMAGE}
          args: [sim-shard, --host, 0.0.0.0, --port, "8000", --model, Qwen/Qwen2.5-7B-Instruct]
          ports: [{{name: http, containerPort: 8000}}]
          readinessProbe: {{httpGet: {{path: /health, port: http}}, periodSeconds: 5}}
          lifecycle: {{preStop: {{sleep: {{seconds: {PRESTOP_SECONDS}}}}}}}
---
apiVersion: v1
kind: Service
metadata: {{name: sim-served}}
spec:
  selector: {{app.kubernetes.io/name: sim-served}}
  ports: [{{name: http, port: 8000, targetPort: http}}]
---
apiVersion: rolloutfleet.dev/v1alpha1
kind: RolloutFleet
metadata: {{name: served}}
spec:
  shardPods:
    service: sim-served
    targetPort: {{name: http}}
    model: Qwen/Qwen2.5-7B-Instruct
    probe: {{path: /health, periodSeconds: 5, timeoutSeconds: 2, failureThreshold: 3, successThreshold: 2}}
"""


@pytest.fixture(scope="module")
def pods(installed: Installed) -> Iterator[Installed]:
    """The release upgraded for pod members and the router, and both pod fleets Healthy."""
    installed.upgrade(
        f"operator.probe.allowedHosts={{{node_tool.POD_CIDR}}}",
        "router.enabled=true",
        "router.fleet=demo",
        "router.fleetNamespace=default",
    )
    node = installed.node
    node.kubectl("apply", "-f", str(REPO_ROOT / "examples" / "pods" / "sim-replicas.yaml"))
    node.kubectl("apply", "-f", "-", stdin=SERVED_MANIFEST)
    until("fleet replicas at 3/3", lambda: installed.fleet("replicas").get("healthy") == "3/3", node)
    until("fleet served at 2/2", lambda: installed.fleet("served").get("healthy") == "2/2", node)
    yield installed
    node.kubectl("delete", "-f", str(REPO_ROOT / "examples" / "pods" / "sim-replicas.yaml"), "--wait=false")
    node.kubectl("delete", "-f", "-", "--wait=false", stdin=SERVED_MANIFEST)
    node.kubectl("delete", "policyversion", "replicas", "--ignore-not-found", "--wait=false")


def instance(pod: dict[str, Any]) -> str:
    """The pod's identity as the operator publishes it: ``<uid>:<total container restarts>``."""
    restarts = sum(c["restartCount"] for c in pod["status"]["containerStatuses"])
    return f"{pod['metadata']['uid']}:{restarts}"


def members(status: dict[str, Any]) -> dict[str, tuple[str, str | None]]:
    """A fleet's healthy set: member name -> (endpoint, instance)."""
    return {entry["name"]: (entry["endpoint"], entry.get("instance")) for entry in status.get("shards", [])}


def degraded(status: dict[str, Any]) -> str:
    """The fleet's Degraded condition's message: it names each member out of the healthy set and its phase."""
    return next((c["message"] for c in status.get("conditions", []) if c["type"] == "Degraded"), "")


def test_pods_selected_by_label_are_members_at_their_pod_ips_with_their_instance(pods: Installed) -> None:
    running = pods.ready_pods(REPLICAS)
    assert len(running) == 3
    expected = {p["metadata"]["name"]: (f"http://{p['status']['podIP']}:8000", instance(p)) for p in running}
    assert members(pods.fleet("replicas")) == expected
    for endpoint, _ in expected.values():  # real pod IPs on the node's bridge, assigned by the CNI plugin
        assert endpoint.startswith("http://10.244.0."), endpoint


def test_a_services_endpointslices_give_the_members_with_their_pod_ips(pods: Installed) -> None:
    slices = pods.node.json("get", "endpointslices", "-l", "kubernetes.io/service-name=sim-served")["items"]
    addresses = {
        endpoint["targetRef"]["name"]: endpoint["addresses"][0]
        for piece in slices
        for endpoint in piece.get("endpoints") or []
        if endpoint["conditions"].get("ready")
    }
    running = {p["metadata"]["name"]: p for p in pods.ready_pods(SERVED)}
    assert addresses == {name: p["status"]["podIP"] for name, p in running.items()}, "the controller's slices"
    expected = {name: (f"http://{ip}:8000", instance(running[name])) for name, ip in addresses.items()}
    assert members(pods.fleet("served")) == expected


def refit(pods: Installed, version: int, instances: dict[str, str]) -> None:
    """Write the trainer's PolicyVersion for fleet ``replicas``: every member refit to ``version``, as it is now."""
    stamp = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    policy = {
        "apiVersion": "rolloutfleet.dev/v1alpha1",
        "kind": "PolicyVersion",
        "metadata": {"name": "replicas", "namespace": "default"},
        "spec": {
            "policyVersion": version,
            "refits": [
                {"shard": name, "version": version, "instance": identity, "phase": "Succeeded", "time": stamp}
                for name, identity in sorted(instances.items())
            ],
        },
    }
    pods.node.kubectl("apply", "-f", "-", stdin=json.dumps(policy))


def weights(status: dict[str, Any]) -> dict[str, tuple[int | None, bool]]:
    return {w["name"]: (w.get("weightsVersion"), w["stale"]) for w in status.get("shardWeights", [])}


def test_a_kubelet_restarted_shard_is_stale_until_the_trainer_refits_it(pods: Installed) -> None:
    """The member's instance is ``<pod uid>:<restarts>``: a container restarted in place (same pod, same IP, Ready
    again for the kubelet, answering its probes) holds base weights, so it stays out of the healthy set as Stale
    until the trainer records a refit of that new instance in the fleet's PolicyVersion."""
    node = pods.node
    before = {name: ident for name, (_, ident) in members(pods.fleet("replicas")).items() if ident}
    assert len(before) == 3
    refit(pods, 1, before)
    until("every member at weights version 1", lambda: weights(pods.fleet("replicas")) == {
        name: (1, False) for name in before}, node)  # fmt: skip
    victim = pods.ready_pods(REPLICAS)[0]
    name = victim["metadata"]["name"]
    restarted = sigkill_until_restarted(pods, victim)

    def stale_while_ready() -> dict[str, Any] | None:
        status = pods.fleet("replicas")
        ready = is_ready(node.json("get", "pod", name))
        return status if ready and f"GenerationShard/{name} (Stale)" in degraded(status) else None

    status = until(f"{name} Stale while its pod is Ready", stale_while_ready, node)
    assert name not in members(status), "a Stale member takes no traffic, however well it probes"
    assert weights(status)[name] == (None, True), "the new instance holds no known version: base weights"
    assert status["healthy"] == "2/3"
    refit(pods, 1, {**before, name: instance(restarted)})
    status = until("the refit member back in the healthy set", lambda: (
        s if (s := pods.fleet("replicas")).get("healthy") == "3/3" else None), node)  # fmt: skip
    assert members(status)[name][1] == instance(restarted) == f"{victim['metadata']['uid']}:1"
    assert weights(status)[name] == (1, False)


def test_a_pod_deleted_with_a_grace_period_is_draining_until_it_is_gone(pods: Installed) -> None:
    """``kubectl delete`` sets deletionTimestamp and the kubelet runs the pod's preStop (its container still serves):
    the member is Draining, out of the healthy set at once, and leaves the fleet when the pod is gone."""
    node = pods.node
    victim = pods.ready_pods(SERVED)[0]
    name = victim["metadata"]["name"]
    node.kubectl("delete", "pod", name, "--wait=false")

    def draining() -> dict[str, Any] | None:
        status = pods.fleet("served")
        return status if f"GenerationShard/{name} (Draining)" in degraded(status) else None

    status = until(f"{name} Draining", draining, node)
    assert name not in members(status)
    pod = node.json("get", "pod", name)
    assert pod["metadata"]["deletionTimestamp"], "the pod is terminating"
    (container,) = pod["status"]["containerStatuses"]
    assert "running" in container["state"], f"still in its preStop, not yet SIGTERMed: {container['state']}"
    # The kubelet does not cut a running preStop short for a shorter grace period: remove the pod now instead
    node.kubectl("delete", "pod", name, "--grace-period=0", "--force", "--wait=true")
    until(f"{name} gone from fleet served, its replacement in", lambda: (
        (s := pods.fleet("served")).get("healthy") == "2/2" and name not in members(s)
        and name not in degraded(s)), node)  # fmt: skip


def router_url(pods: Installed) -> str:
    service = pods.node.json("get", "service", "rollout-fleet-router", "-n", "fleet-system")
    return f"http://{service['spec']['clusterIP']}:{service['spec']['ports'][0]['port']}"


def complete(url: str, session: str) -> tuple[int, str, str]:
    """One completion through the router's Service (kube-proxy's ClusterIP): (status, shard, attempts)."""
    body = json.dumps({"model": "Qwen/Qwen2.5-7B-Instruct", "prompt": "2+2=", "max_tokens": 4}).encode()
    request = urllib.request.Request(f"{url}/v1/completions", body, {
        "Content-Type": "application/json", "X-Session-ID": session})  # fmt: skip
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, response.headers["X-Rollout-Shard"], response.headers["X-Rollout-Attempts"]
    except urllib.error.HTTPError as error:
        return error.code, error.headers.get("X-Rollout-Shard", ""), error.headers.get("X-Rollout-Attempts", "")


def test_the_router_deployment_serves_the_fleet_and_stops_sending_to_a_killed_shard(pods: Installed) -> None:
    node = pods.node
    url = router_url(pods)
    assert len(pods.ready_pods(ROUTER, "fleet-system")) == 2

    def shards_answering(count: int = 16) -> set[str]:
        answers = [complete(url, f"session-{i}") for i in range(count)]
        return {shard for status, shard, _ in answers if status == 200}

    until("the router's answers from both shards", lambda: shards_answering() == {"vllm-0", "vllm-1"}, node)
    node.kubectl("scale", "deployment", "vllm-1", "--replicas=0")
    try:
        until("vllm-1 out of fleet demo", lambda: pods.fleet().get("healthy") == "1/2", node)
        until("vllm-1's pod gone", lambda: not pods.pods("app.kubernetes.io/instance=vllm-1"), node)

        def first_tries_on_vllm_0() -> bool:
            answers = [complete(url, f"session-{i}") for i in range(16)]
            return all(answer == (200, "vllm-0", "1") for answer in answers)

        until("every request answered by vllm-0 at its first attempt", first_tries_on_vllm_0, node)
    finally:
        node.kubectl("scale", "deployment", "vllm-1", "--replicas=1")
    until("fleet demo at 2/2 again", lambda: pods.fleet().get("healthy") == "2/2", node)
    until("the router sending to vllm-1 again", lambda: "vllm-1" in shards_answering(), node)


def can_i(pods: Installed, account: str, *args: str) -> bool:
    done = pods.node.kubectl("auth", "can-i", *args, f"--as=system:serviceaccount:fleet-system:{account}",
                             check=False)  # fmt: skip
    assert done.stdout.strip() in ("yes", "no"), done.stderr
    return done.stdout.strip() == "yes"


IN_POD_CLIENT = textwrap.dedent("""
    import json, ssl, sys, urllib.error, urllib.request
    sa = "/var/run/secrets/kubernetes.io/serviceaccount"
    context = ssl.create_default_context(cafile=f"{sa}/ca.crt")
    token = open(f"{sa}/token").read()
    codes = {}
    for path in sys.argv[1:]:
        request = urllib.request.Request("https://kubernetes.default.svc" + path,
                                         headers={"Authorization": "Bearer " + token})
        try:
            codes[path] = urllib.request.urlopen(request, context=context, timeout=10).status
        except urllib.error.HTTPError as error:
            codes[path] = error.code
    print(json.dumps(codes))
""")


def test_the_pods_service_accounts_get_exactly_what_the_chart_grants(pods: Installed) -> None:
    """The operator runs on its pod's token with the chart's ClusterRole (every test above is that); here a verb the
    chart does not grant is refused, and the router's own token, used from inside its pod through the kubernetes
    Service, reads its one fleet and nothing else."""
    operator = "rollout-fleet"
    assert can_i(pods, operator, "patch", "rolloutfleets.rolloutfleet.dev", "--subresource=status", "-n", "default")
    assert can_i(pods, operator, "watch", "pods", "-n", "default")
    assert can_i(pods, operator, "list", "endpointslices.discovery.k8s.io", "-n", "default")
    refused = [("delete", "pods"), ("get", "secrets"), ("create", "pods"), ("create", "pods/exec")]
    refused += [("patch", "rolloutfleets.rolloutfleet.dev"), ("patch", "policyversions.rolloutfleet.dev")]
    for verb in refused:  # the spec is the user's, the PolicyVersion the trainer's; no pod is the operator's to touch
        assert not can_i(pods, operator, *verb, "-n", "default"), f"the operator may {verb}"
    router = "rollout-fleet-router"
    assert can_i(pods, router, "get", "rolloutfleets.rolloutfleet.dev/demo", "-n", "default")
    assert not can_i(pods, router, "get", "rolloutfleets.rolloutfleet.dev/replicas", "-n", "default")
    assert not can_i(
        pods, router, "patch", "rolloutfleets.rolloutfleet.dev/demo", "--subresource=status", "-n", "default"
    )
    (pod, *_) = pods.ready_pods(ROUTER, "fleet-system")
    fleets = "/apis/rolloutfleet.dev/v1alpha1/namespaces/default/rolloutfleets"
    paths = [f"{fleets}/demo", f"{fleets}/replicas", "/api/v1/namespaces/default/pods"]
    done = pods.node.kubectl("exec", "-n", "fleet-system", pod["metadata"]["name"], "--", "python", "-c",
                             IN_POD_CLIENT, *paths)  # fmt: skip
    assert json.loads(done.stdout) == {paths[0]: 200, paths[1]: 403, paths[2]: 403}


def test_prometheus_scrapes_the_operator_and_shard_pods_at_their_pod_ips(
    pods: Installed, prometheus_factory: PrometheusFactory
) -> None:
    """Static targets, the pods' IPs as the API lists them (Debian's prometheus is built without kubernetes_sd): the
    operator's and the shard pods' own /metrics, reached from the host across the node's bridge."""
    (operator,) = pods.ready_pods(OPERATOR, "fleet-system")
    assert operator["metadata"]["name"] == pods.lease_holder()
    shards = pods.ready_pods(REPLICAS)
    targets = [f"{operator['status']['podIP']}:8080", *(f"{p['status']['podIP']}:8000" for p in shards)]
    prometheus = prometheus_factory(targets, job="pods")
    prometheus.wait_for_series(f"count(up == 1) == {len(targets)}", timeout=60)
    (healthy,) = prometheus.wait_for_series('fleet_healthy_shards{namespace="default", fleet="replicas"}', timeout=60)
    assert healthy["value"][1] == "3"
    starts = prometheus.wait_for_series("process_start_time_seconds", timeout=60)
    assert {s["metric"]["instance"] for s in starts} >= set(targets[1:]), "every shard pod's own /metrics"
