"""Pod members, pure (fleet_operator.discovery): which members pods and EndpointSlices yield, their identity, and
the inputs beside probes (readiness, termination, LeaderWorkerSet roles)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fleet_operator.discovery import (
    LWS_GROUP_INDEX,
    LWS_NAME,
    LWS_WORKER_INDEX,
    SERVICE_NAME_LABEL,
    PodView,
    instance_identity,
    member_spec,
    member_url,
    observe_endpoint_slice,
    observe_pod,
    pod_member,
    slice_members,
)
from rollout_runtime.kube.api import EnvironmentServerSpec, GenerationShardSpec, RolloutFleetSpec, ShardPods
from support.pods import pod


def selection(**extra: Any) -> ShardPods:
    return ShardPods.model_validate(
        {"selector": {"matchLabels": {"app": "vllm"}}, "targetPort": {"name": "http"}, **extra}
    )


def test_a_ready_selected_pod_is_one_member_at_its_ip_and_named_port() -> None:
    member = pod_member(selection(), observe_pod(pod()))
    assert member is not None
    assert (member.name, member.endpoint, member.instance, member.draining) == (
        "vllm-0",
        "http://10.1.0.5:8000",
        "u-0:0",
        False,
    )


def test_the_instance_changes_on_a_container_restart_with_the_same_ip_and_on_a_new_pod_uid() -> None:
    first = pod_member(selection(), observe_pod(pod(restarts=(0, 2))))
    restarted = pod_member(selection(), observe_pod(pod(restarts=(1, 2))))
    replaced = pod_member(selection(), observe_pod(pod(uid="u-1", restarts=(0, 2))))
    assert first is not None
    assert restarted is not None
    assert replaced is not None
    assert first.endpoint == restarted.endpoint == replaced.endpoint, "same IP: only the identity tells"
    assert first.instance == "u-0:2"
    assert restarted.instance == "u-0:3" != first.instance
    assert replaced.instance == "u-1:2" != first.instance


@given(st.text(min_size=1, max_size=36), st.lists(st.integers(0, 10_000), max_size=8))
def test_identity_is_uid_and_total_restarts(uid: str, restarts: list[int]) -> None:
    """Invariant: the instance is ``<uid>:<sum of restartCount>``, and one more restart anywhere changes it."""
    body = pod(uid=uid, restarts=tuple(restarts))
    view = observe_pod(body)
    assert view.instance == instance_identity(uid, sum(restarts)) == f"{uid}:{sum(restarts)}"
    bumped = observe_pod(pod(uid=uid, restarts=(*restarts, 1)))
    assert bumped.instance != view.instance


@pytest.mark.parametrize(
    ("body", "draining"),
    [
        (pod(deleting=True), True),  # terminating -> Draining
        (pod(ready=False), True),  # not Ready: held out, probes keep running
        (pod(), False),
    ],
)
def test_terminating_or_unready_pods_are_members_held_out_of_traffic(body: dict[str, Any], draining: bool) -> None:
    member = pod_member(selection(), observe_pod(body))
    assert member is not None
    assert member.draining is draining
    spec = member_spec(selection(), member)
    assert isinstance(spec, GenerationShardSpec)
    assert spec.drain is draining


@pytest.mark.parametrize(
    "body",
    [
        pod(ip=None),  # not scheduled / no IP yet
        pod(phase="Succeeded"),
        pod(phase="Failed"),
        pod(labels={"app": "other"}),
        pod(labels={"app": "vllm", LWS_NAME: "big", LWS_GROUP_INDEX: "0", LWS_WORKER_INDEX: "1"}),
        pod(ip="not-an-ip"),
    ],
)
def test_pods_that_are_not_members(body: dict[str, Any]) -> None:
    assert pod_member(selection(), observe_pod(body)) is None


def test_a_leaderworkerset_group_is_one_member_its_leader_and_a_recreated_group_is_a_new_instance() -> None:
    labels = {"app": "vllm", LWS_NAME: "big", LWS_GROUP_INDEX: "0"}
    leader = pod("big-0", uid="l-1", labels={**labels, LWS_WORKER_INDEX: "0"})
    workers = [pod(f"big-0-{i}", uid=f"w-{i}", labels={**labels, LWS_WORKER_INDEX: str(i)}) for i in (1, 2, 3)]
    members = [m for b in (leader, *workers) if (m := pod_member(selection(), observe_pod(b))) is not None]
    assert [m.name for m in members] == ["big-0"]
    recreated = pod_member(selection(), observe_pod(pod("big-0", uid="l-2", labels={**labels, LWS_WORKER_INDEX: "0"})))
    assert recreated is not None
    assert recreated.name == "big-0"
    assert recreated.instance != members[0].instance


def test_a_named_port_the_pod_lacks_makes_no_member_and_a_number_needs_no_declaration() -> None:
    assert pod_member(selection(targetPort={"name": "grpc"}), observe_pod(pod())) is None
    numbered = pod_member(selection(targetPort={"number": 9000}), observe_pod(pod()))
    assert numbered is not None
    assert numbered.endpoint == "http://10.1.0.5:9000"


def test_ipv6_pod_ips_are_bracketed() -> None:
    assert member_url("http", "fd00::5", 8000) == "http://[fd00::5]:8000"


def endpoint_slice(endpoints: list[dict[str, Any]], *, service: str = "vllm") -> dict[str, Any]:
    return {
        "metadata": {"name": f"{service}-abcde", "namespace": "ns", "labels": {SERVICE_NAME_LABEL: service}},
        "addressType": "IPv4",
        "ports": [{"name": "http", "port": 8000, "protocol": "TCP"}],
        "endpoints": endpoints,
    }


def ep(address: str, name: str, uid: str, **conditions: bool) -> dict[str, Any]:
    return {
        "addresses": [address],
        "conditions": conditions,
        "targetRef": {"kind": "Pod", "name": name, "namespace": "ns", "uid": uid},
    }


def test_a_services_endpoint_slices_yield_one_member_per_endpoint_with_pod_identity_when_known() -> None:
    by_service = ShardPods.model_validate({"service": "vllm", "targetPort": {"name": "http"}})
    slices = [
        observe_endpoint_slice(
            endpoint_slice(
                [
                    ep("10.1.0.5", "vllm-0", "u-0", ready=True),
                    ep("10.1.0.6", "vllm-1", "u-1", ready=False, serving=True, terminating=True),
                ]
            )
        ),
        observe_endpoint_slice(endpoint_slice([ep("10.9.0.1", "x-0", "ux", ready=True)], service="other")),
    ]
    pods: dict[str, PodView] = {"vllm-0": observe_pod(pod(restarts=(4,)))}
    members = slice_members(by_service, slices, pods)
    assert [(m.name, m.endpoint, m.instance, m.draining) for m in members] == [
        ("vllm-0", "http://10.1.0.5:8000", "u-0:4", False),
        ("vllm-1", "http://10.1.0.6:8000", "u-1", True),  # pod unknown: the slice's UID; terminating: held out
    ]


def test_a_slice_naming_an_old_pod_of_the_same_name_does_not_take_the_new_pods_identity() -> None:
    by_service = ShardPods.model_validate({"service": "vllm", "targetPort": {"number": 8000}})
    slices = [observe_endpoint_slice(endpoint_slice([ep("10.1.0.5", "vllm-0", "old", ready=True)]))]
    (member,) = slice_members(by_service, slices, {"vllm-0": observe_pod(pod(uid="new"))})
    assert member.instance == "old"


def test_a_fleet_needs_shards_from_objects_or_pods_and_a_pod_selection_needs_exactly_one_source() -> None:
    RolloutFleetSpec.model_validate({"shardPods": {"service": "vllm", "targetPort": {"number": 8000}}})
    with pytest.raises(ValueError, match="shardSelector"):
        RolloutFleetSpec.model_validate({"minReadyShards": 1})
    with pytest.raises(ValueError, match="exactly one of selector"):
        ShardPods.model_validate({"service": "a", "selector": {}, "targetPort": {"number": 1}})
    with pytest.raises(ValueError, match="exactly one of number or name"):
        ShardPods.model_validate({"service": "a", "targetPort": {"number": 1, "name": "http"}})


def test_environment_server_pods_become_environment_server_specs() -> None:
    spec = RolloutFleetSpec.model_validate(
        {
            "shardSelector": {},
            "environmentServerPods": {
                "selector": {"matchLabels": {"app": "vllm"}},
                "targetPort": {"number": 9000},
                "maxConcurrentEpisodes": 8,
            },
        }
    )
    assert spec.environment_server_pods is not None
    member = pod_member(spec.environment_server_pods, observe_pod(pod()))
    assert member is not None
    env = member_spec(spec.environment_server_pods, member)
    assert isinstance(env, EnvironmentServerSpec)
    assert env.max_concurrent_episodes == 8
    assert env.endpoint == "http://10.1.0.5:9000"


def test_malformed_pod_bodies_read_as_absent_and_never_raise() -> None:
    view = observe_pod({"metadata": None, "status": {"containerStatuses": [{"restartCount": "x"}, None]}})
    assert (view.ip, view.restarts, view.ready) == (None, 0, False)
