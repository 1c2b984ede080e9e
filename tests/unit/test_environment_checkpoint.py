"""Partial-rollout checkpoints: park/resume, wait vs replay, restart-only episodes, continuation, durable store."""

from __future__ import annotations

import asyncio
import functools
import json
from collections import defaultdict
from pathlib import Path

import pytest

from rollout_runtime.environment import (
    BaseEnvironmentServer,
    CheckpointAborted,
    CheckpointCoordinator,
    CheckpointingOff,
    CheckpointRecord,
    CorruptCheckpointError,
    EnvironmentServerConfig,
    EpisodeContext,
    EpisodeRequest,
    EpisodeResponse,
    EpisodeSteps,
    FilesystemCheckpointStore,
    MemoryCheckpointStore,
    ProtocolState,
    seed_restarts,
)
from rollout_runtime.environment.checkpoint import CheckpointStore, input_digest
from support.environment import until


class StepRequest(EpisodeRequest):
    steps: int = 3
    verify: bool = False
    restart: bool = False


class StepServer(BaseEnvironmentServer[StepRequest, EpisodeResponse]):
    """Each step waits on a gate the test opens; the test can see which steps ran, and when."""

    protocol_name = "steps"
    request_model = StepRequest
    response_model = EpisodeResponse

    def __init__(self, config: EnvironmentServerConfig | None = None, store: CheckpointStore | None = None) -> None:
        super().__init__(config, checkpoint_store=store)
        self.gates: defaultdict[str, asyncio.Event] = defaultdict(asyncio.Event)
        self.entered: defaultdict[str, asyncio.Event] = defaultdict(asyncio.Event)
        self.runs: list[str] = []
        self.contexts: dict[str, EpisodeContext] = {}
        self.state_builds = 0

    async def run_episode(self, request: StepRequest, episode: EpisodeContext) -> EpisodeResponse:
        self.contexts[request.episode_id] = episode
        if request.restart:
            await episode.mark_restart()
        continuation = episode.checkpoint_continuation()
        start = int(continuation.data["next"]) if continuation else 0  # type: ignore[arg-type]
        for i in range(start, request.steps):
            await episode.step(f"s{i}", functools.partial(self._work, f"{request.episode_id}/s{i}"))
            await episode.record(functools.partial(self._state, i + 1))
        if request.verify:
            await episode.step("verify", functools.partial(self._work, f"{request.episode_id}/verify"), mode="replay")
        return EpisodeResponse(episode_id=request.episode_id, reward=1.0)

    def _state(self, next_index: int) -> ProtocolState:
        self.state_builds += 1
        return ProtocolState(next_step=f"s{next_index}", data={"next": next_index})

    async def _work(self, key: str) -> None:
        self.runs.append(key)
        self.entered[key].set()
        await self.gates[key].wait()

    def open_gates(self, *keys: str) -> None:
        for key in keys:
            self.gates[key].set()


def _record(request: StepRequest, next_index: int) -> CheckpointRecord:
    return CheckpointRecord(
        episode_id=request.episode_id,
        protocol="steps",
        input_digest=input_digest(request.model_dump(mode="json")),
        checkpoint_id="c0",
        steps_recorded=next_index,
        state=ProtocolState(next_step=f"s{next_index}", data={"next": next_index}),
    )


async def test_a_checkpoint_waits_for_a_wait_step_then_parks_and_exports_the_episode() -> None:
    store = MemoryCheckpointStore()
    server = StepServer(store=store)
    server.open_gates("e/s0")
    episode = asyncio.create_task(server.serve_episode(StepRequest(episode_id="e")))
    await server.entered["e/s1"].wait()  # busy inside wait step s1

    checkpoint = asyncio.create_task(server.checkpoints.open())
    await until(lambda: server.checkpoints.is_open)
    for _ in range(50):
        await asyncio.sleep(0)
    assert not checkpoint.done()  # held up by the busy wait step

    server.open_gates("e/s1", "e/s2")
    manifest = await checkpoint

    assert manifest.episodes["e"].next_step == "s2"
    assert manifest.episodes["e"].steps_recorded == 2
    assert store.records["e"].state.data == {"next": 2}
    assert server.contexts["e"].steps.parked
    assert not server.entered["e/s2"].is_set()  # parked at the boundary, not running on

    assert server.checkpoints.resume()
    result = await episode
    assert result.outcome == "success"
    assert server.runs == ["e/s0", "e/s1", "e/s2"]
    assert store.records == {}  # a finished episode leaves no checkpoint behind


async def test_a_replay_step_does_not_hold_up_a_checkpoint() -> None:
    store = MemoryCheckpointStore()
    server = StepServer(store=store)
    server.open_gates("e/s0")
    episode = asyncio.create_task(server.serve_episode(StepRequest(episode_id="e", steps=1, verify=True)))
    await server.entered["e/verify"].wait()  # running the replay step, gate closed

    manifest = await server.checkpoints.open()

    assert manifest.episodes["e"].next_step == "s1"  # the state before the replay step: a restore re-runs it
    assert not server.contexts["e"].steps.parked
    server.open_gates("e/verify")
    server.checkpoints.resume()
    assert (await episode).outcome == "success"


async def test_a_replay_step_that_finishes_under_an_open_checkpoint_parks_before_recording() -> None:
    store = MemoryCheckpointStore()
    steps = EpisodeSteps(CheckpointCoordinator(store), episode_id="e", input_digest="d")
    await steps.start()
    await steps.record({"next_step": "s1", "data": {"n": 1}})
    entered, gate = asyncio.Event(), asyncio.Event()

    async def read() -> None:
        entered.set()
        await gate.wait()

    replay = asyncio.create_task(steps.step("read", read, mode="replay"))
    await entered.wait()
    manifest = await steps.coordinator.open()
    gate.set()
    await replay
    recording = asyncio.create_task(steps.record({"next_step": "s2"}))
    await until(lambda: steps.parked)

    assert steps.latest is not None
    assert steps.latest.next_step == "s1"
    assert manifest.episodes["e"].next_step == "s1"
    steps.coordinator.resume()
    await recording
    assert steps.latest is not None
    assert steps.latest.next_step == "s2"


async def test_restart_only_episodes_never_hold_up_a_checkpoint_and_are_never_exported() -> None:
    store = MemoryCheckpointStore()
    server = StepServer(store=store)
    episode = asyncio.create_task(server.serve_episode(StepRequest(episode_id="r", restart=True)))
    await server.entered["r/s0"].wait()  # inside a wait step

    manifest = await server.checkpoints.open()

    assert manifest.episodes == {}
    assert store.records == {}
    assert server.state_builds == 0
    server.open_gates("r/s0", "r/s1", "r/s2")  # it keeps running through the open checkpoint
    assert (await episode).outcome == "success"
    assert server.state_builds == 0  # state builders run only for episodes that take part
    server.checkpoints.resume()


async def test_a_replacement_attempt_continues_from_the_exported_state_once() -> None:
    store = MemoryCheckpointStore()
    request = StepRequest(episode_id="e", steps=4)
    await store.save(_record(request, 2))
    server = StepServer(store=store)
    server.open_gates("e/s2", "e/s3")

    result = await server.serve_episode(request)

    assert result.outcome == "success"
    assert server.runs == ["e/s2", "e/s3"]  # s0 and s1 were not run again
    assert server.contexts["e"].checkpoint_continuation() is None  # handed out once only


async def test_a_checkpoint_recorded_for_another_input_is_refused() -> None:
    store = MemoryCheckpointStore()
    await store.save(_record(StepRequest(episode_id="e", steps=4), 2))
    server = StepServer(store=store)

    result = await server.serve_episode(StepRequest(episode_id="e", steps=5))

    failure = result.response.failure
    assert failure is not None
    assert (failure.stage, failure.terminal) == ("checkpoint", True)
    assert "different input" in failure.reason
    assert server.runs == []
    assert "e" in store.records  # left for whoever owns it


async def test_state_builders_are_not_called_when_checkpointing_is_off() -> None:
    server = StepServer(store=None)
    server.open_gates("e/s0", "e/s1", "e/s2")
    assert (await server.serve_episode(StepRequest(episode_id="e"))).outcome == "success"
    assert server.state_builds == 0
    with pytest.raises(CheckpointingOff):
        await server.checkpoints.open()


@pytest.mark.looptime
async def test_parked_time_does_not_count_against_the_episode_deadline() -> None:
    store = MemoryCheckpointStore()
    server = StepServer(EnvironmentServerConfig(default_episode_timeout_seconds=10.0), store=store)
    server.open_gates("e/s0")
    episode = asyncio.create_task(server.serve_episode(StepRequest(episode_id="e", steps=2)))
    await server.entered["e/s1"].wait()
    server.open_gates("e/s1")
    await server.checkpoints.open()  # the episode records s1's state, then parks
    await asyncio.sleep(100.0)  # the checkpoint stays open ten times the episode deadline

    server.checkpoints.resume()
    result = await episode

    assert result.outcome == "success"


@pytest.mark.looptime
async def test_the_deadline_still_applies_after_parking() -> None:
    store = MemoryCheckpointStore()
    server = StepServer(EnvironmentServerConfig(default_episode_timeout_seconds=10.0), store=store)
    server.open_gates("e/s0")
    episode = asyncio.create_task(server.serve_episode(StepRequest(episode_id="e", steps=2)))
    await server.entered["e/s1"].wait()
    checkpoint = asyncio.create_task(server.checkpoints.open())
    await until(lambda: server.checkpoints.is_open)
    server.checkpoints.resume()
    with pytest.raises(CheckpointAborted):
        await checkpoint

    result = await episode  # s1 never opens

    assert result.outcome == "timeout"
    assert store.records == {}  # the aborted checkpoint exported nothing


async def test_an_infra_failure_keeps_the_checkpoint_for_the_retry_and_success_drops_it() -> None:
    store = MemoryCheckpointStore()
    request = StepRequest(episode_id="e", steps=2)
    await store.save(_record(request, 1))

    class Flaky(StepServer):
        async def _work(self, key: str) -> None:
            from rollout_runtime.environment import dependency_episode_failure

            raise dependency_episode_failure(ConnectionResetError("tool died"), stage=key)

    failed = await Flaky(store=store).serve_episode(request)
    assert failed.response.failure is not None
    assert not failed.response.failure.terminal
    assert "e" in store.records

    server = StepServer(store=store)
    server.open_gates("e/s1")
    assert (await server.serve_episode(request)).outcome == "success"
    assert server.runs == ["e/s1"]
    assert "e" not in store.records


def test_seed_replies_can_ask_for_a_restart() -> None:
    assert seed_restarts({"checkpoint": "restart"})
    assert seed_restarts({"checkpoint": "RESTART"})
    assert not seed_restarts({"checkpoint": "exported"})
    assert not seed_restarts({})


# -- the durable filesystem store ------------------------------------------------------------------------------


def _sample(episode_id: str = "ep-1") -> CheckpointRecord:
    return CheckpointRecord(
        episode_id=episode_id,
        protocol="steps",
        input_digest="d" * 64,
        checkpoint_id="c1",
        steps_recorded=3,
        state=ProtocolState(next_step="s3", data={"totals": [1, 3, 6], "note": "ünïcode"}),
    )


async def test_the_filesystem_store_round_trips_and_deletes(tmp_path: Path) -> None:
    store = FilesystemCheckpointStore(tmp_path)
    await store.save(_sample())
    await store.save(_sample())  # replacing is atomic too

    assert await store.load("ep-1") == _sample()
    assert await store.load("missing") is None
    await store.delete("ep-1")
    await store.delete("ep-1")
    assert await store.load("ep-1") is None
    assert not store.path_for("ep-1").exists()


def _corrupt(path: Path, how: str) -> None:
    raw = path.read_bytes()
    if how == "truncated":
        path.write_bytes(raw[: len(raw) // 2])
    elif how == "empty":
        path.write_bytes(b"")
    elif how == "altered":
        envelope = json.loads(raw)
        envelope["payload"]["state"]["data"]["totals"] = [1, 3, 7]
        path.write_text(json.dumps(envelope))
    elif how == "foreign":
        path.write_text(json.dumps({"hello": "world"}))
    elif how == "future":
        envelope = json.loads(raw)
        envelope["version"] = 99
        path.write_text(json.dumps(envelope))
    elif how == "binary":
        path.write_bytes(b"\xff\xfe\x00garbage")


@pytest.mark.parametrize(
    ("how", "problem"),
    [
        ("truncated", "not valid JSON"),
        ("empty", "empty"),
        ("altered", "checksum mismatch"),
        ("foreign", "not a rollout-fleet/episode-checkpoint file"),
        ("future", "unsupported version 99"),
        ("binary", "not valid JSON"),
    ],
)
async def test_a_corrupt_checkpoint_file_is_rejected_with_a_clear_error(tmp_path: Path, how: str, problem: str) -> None:
    store = FilesystemCheckpointStore(tmp_path)
    await store.save(_sample())
    path = store.path_for("ep-1")
    _corrupt(path, how)

    with pytest.raises(CorruptCheckpointError, match=problem) as caught:
        await store.load("ep-1")

    assert caught.value.path == str(path)
    assert str(path) in str(caught.value)
    assert "was not loaded" in str(caught.value)


async def test_a_checkpoint_file_of_another_episode_is_rejected(tmp_path: Path) -> None:
    store = FilesystemCheckpointStore(tmp_path)
    await store.save(_sample("ep-1"))
    store.path_for("ep-1").rename(store.path_for("ep-2"))

    with pytest.raises(CorruptCheckpointError, match="belongs to episode 'ep-1'"):
        await store.load("ep-2")


async def test_a_torn_temporary_file_from_a_crash_is_swept_and_the_last_good_one_kept(tmp_path: Path) -> None:
    store = FilesystemCheckpointStore(tmp_path)
    await store.save(_sample())
    torn = tmp_path / ".ep-1.checkpoint.json.1234.abcd.tmp"
    torn.write_bytes(b'{"format": "rollout-fleet/episode-che')  # a crash mid-write, before the rename

    reopened = FilesystemCheckpointStore(tmp_path)

    assert not torn.exists()
    assert await reopened.load("ep-1") == _sample()


@pytest.mark.parametrize("episode_id", ["../escape", "a/b", "", ".hidden", "x" * 200])
def test_episode_ids_that_are_not_safe_file_names_are_refused(tmp_path: Path, episode_id: str) -> None:
    with pytest.raises(ValueError, match="safe file name"):
        FilesystemCheckpointStore(tmp_path).path_for(episode_id)


async def test_a_corrupt_checkpoint_fails_the_episode_loudly_and_stays_on_disk(tmp_path: Path) -> None:
    store = FilesystemCheckpointStore(tmp_path)
    request = StepRequest(episode_id="e", steps=3)
    await store.save(_record(request, 1))
    _corrupt(store.path_for("e"), "truncated")
    server = StepServer(store=store)

    result = await server.serve_episode(request)

    failure = result.response.failure
    assert failure is not None
    assert (failure.stage, failure.kind, failure.terminal) == ("checkpoint", "checkpoint_rejected", True)
    assert "is corrupt" in failure.reason
    assert str(store.path_for("e")) in failure.reason
    assert server.runs == []
    assert store.path_for("e").exists()


class _FullDisk(MemoryCheckpointStore):
    def __init__(self) -> None:
        super().__init__()
        self.full = True

    async def save(self, record: CheckpointRecord) -> None:
        if self.full:
            raise OSError(28, "No space left on device")
        await super().save(record)


async def test_a_failed_export_keeps_episodes_parked_and_a_second_open_retries_it() -> None:
    store = _FullDisk()
    server = StepServer(store=store)
    server.open_gates("e/s0")
    episode = asyncio.create_task(server.serve_episode(StepRequest(episode_id="e", steps=2)))
    await server.entered["e/s1"].wait()
    server.open_gates("e/s1")

    with pytest.raises(OSError, match="No space left"):
        await server.checkpoints.open()
    assert server.checkpoints.is_open
    await until(lambda: server.contexts["e"].steps.parked)

    store.full = False
    manifest = await server.checkpoints.open()

    assert manifest.episodes["e"].next_step == "s2"
    assert store.records["e"].state.next_step == "s2"
    server.checkpoints.resume()
    assert (await episode).outcome == "success"
