"""``rollout-fleet router`` as a real process in front of real shard processes, under real chaos.

Shards are sim-shard subprocesses (and, for streams, tests/support/stream_shard.py, since the sim shard does not
stream); faults are SIGKILL, SIGSTOP and 503 bursts, triggered by progress (requests answered), never by sleeping.
Each test checks where requests went (each shard's own request counter) as well as what the client saw.
"""

from __future__ import annotations

import asyncio
import json
import re
import sys
from collections import Counter
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import aiohttp
import pytest

from rollout_runtime.dispatch.affinity import rendezvous_score
from rollout_runtime.environment import EnvironmentClient
from rollout_runtime.router import ATTEMPTS_HEADER, SHARD_HEADER
from rollout_runtime.router.process import RouterProcess, spawn_router
from rollout_runtime.sim import SimFleet
from rollout_runtime.sim.env_process import spawn_env_server
from rollout_runtime.sim.environments import MultiStepResponse
from rollout_runtime.sim.process import ManagedProcess, free_port, until
from rollout_runtime.sim.shard import CRASH_EXIT_CODE
from support.deadlines import within

STREAM_SHARD = Path(__file__).parent.parent / "support" / "stream_shard.py"
FAST_PROBES = ("--probe-period", "0.3")


async def _metric(http: aiohttp.ClientSession, router: RouterProcess, name: str, labels: str = "") -> float:
    async with http.get(router.url + "/metrics") as response:
        text = await response.text()
    pattern = re.compile(rf"^{re.escape(name)}(\{{[^}}]*\}})? (\S+)$", re.M)
    total = 0.0
    for match in pattern.finditer(text):
        if labels in (match[1] or ""):
            total += float(match[2])
    return total


async def _ready(http: aiohttp.ClientSession, router: RouterProcess, routable: int) -> None:
    async def check() -> bool:
        async with http.get(router.url + "/readyz") as response:
            return response.status == 200 and (await response.json())["routable"] >= routable

    await until(
        check, timeout_seconds=60, what=f"router ready with {routable} routable shard(s)", process=router.process
    )


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


async def _router(tmp_path: Path, shards: Sequence[tuple[str, str]], *extra: str) -> RouterProcess:
    args = [arg for name, url in shards for arg in ("--shard", f"{name}={url}")]
    return await spawn_router([*args, *FAST_PROBES, *extra], log_path=tmp_path / "router.log")


async def test_malformed_json_is_400_from_the_router_and_no_shard_sees_it(
    tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    async with SimFleet(1, log_dir=tmp_path) as fleet:
        shard = fleet.shards[0]
        async with await _router(tmp_path, [(shard.name, shard.endpoint)]) as router:
            await _ready(http, router, 1)
            async with http.post(router.url + "/v1/completions", data=b'{"prompt": "x",') as response:
                body = await response.json()
                status = response.status
            async with http.post(router.url + "/v1/chat/completions", data=b"[1, 2]") as response:
                array_status = response.status
            stats = await fleet.stats(shard.name)

    assert status == 400
    assert body["error"]["type"] == "invalid_request_error"
    assert array_status == 400
    assert stats.get("generation_requests", 0) == 0


async def test_an_oversized_body_is_413_before_any_shard(tmp_path: Path, http: aiohttp.ClientSession) -> None:
    async with SimFleet(1, log_dir=tmp_path) as fleet:
        shard = fleet.shards[0]
        async with await _router(tmp_path, [(shard.name, shard.endpoint)], "--max-body-bytes", "2048") as router:
            await _ready(http, router, 1)
            big = json.dumps({"prompt": "word " * 2000}).encode()
            async with http.post(router.url + "/v1/completions", data=big) as response:
                status, body = response.status, await response.json()
            small = {"prompt": "What is 1 + 2?", "max_tokens": 4}
            async with http.post(router.url + "/v1/completions", json=small) as response:
                small_status = response.status
            stats = await fleet.stats(shard.name)
            refused = await _metric(http, router, "router_refused_total", 'reason="too_large"')

    assert status == 413
    assert body["error"]["type"] == "request_too_large"
    assert small_status == 200
    assert stats["generation_requests"] == 1  # only the small one
    assert refused == 1


async def test_no_healthy_shard_is_409_with_a_reason(tmp_path: Path, http: aiohttp.ClientSession) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    async with await _router(tmp_path, [("gone", dead)]) as router:
        async with http.post(router.url + "/v1/chat/completions", json={"messages": []}) as response:
            status, body = response.status, await response.json()
        async with http.get(router.url + "/readyz") as response:
            ready_status = response.status

    assert status == 409
    assert body["error"]["type"] == "no_healthy_shard"
    assert "no healthy shard" in body["error"]["message"]
    assert ready_status == 503


async def test_an_unknown_path_is_404_and_a_wrong_method_405_with_a_json_reason(
    tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    async with await _router(tmp_path, [("gone", dead)]) as router:
        async with http.post(router.url + "/v1/embeddings", json={}) as response:
            unknown = response.status, (await response.json())["error"]["type"]
        async with http.get(router.url + "/v1/chat/completions") as response:
            wrong = response.status, response.headers.get("Allow"), (await response.json())["error"]["type"]

    assert unknown == (404, "not_found")
    assert wrong == (405, "POST", "method_not_allowed")


async def test_the_router_runs_on_uvloop_unless_asked_for_asyncios_loop(
    tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    body = {"prompt": "What is 2 + 2?", "max_tokens": 4}
    answers = {}
    async with SimFleet(1, log_dir=tmp_path) as fleet:
        shard = fleet.shards[0]
        for choice in ("default", "asyncio"):
            extra = () if choice == "default" else ("--event-loop", "asyncio")
            async with await _router(tmp_path, [(shard.name, shard.endpoint)], *extra) as router:
                await _ready(http, router, 1)
                async with http.post(router.url + "/v1/completions", json=body) as response:
                    text = (await response.json())["choices"][0]["text"]
                    answers[choice] = (router.event_loop, response.status, text)

    assert answers["default"] == ("uvloop", 200, "4")
    assert answers["asyncio"] == ("asyncio.unix_events", 200, "4")


async def test_a_session_stays_on_one_shard_and_moves_when_it_dies(tmp_path: Path, http: aiohttp.ClientSession) -> None:
    async with SimFleet(3, log_dir=tmp_path) as fleet:
        shards = [(s.name, s.endpoint) for s in fleet.shards]
        async with await _router(tmp_path, shards) as router:
            await _ready(http, router, 3)

            async def ask(session: str, use_header: bool) -> str:
                body: dict[str, object] = {"messages": [{"role": "user", "content": "What is 2 + 2?"}]}
                headers = {"X-Session-ID": session} if use_header else {}
                if not use_header:
                    body["user"] = session
                async with http.post(router.url + "/v1/chat/completions", json=body, headers=headers) as response:
                    assert response.status == 200, await response.text()
                    return response.headers[SHARD_HEADER]

            by_header = {await ask("episode-7", True) for _ in range(8)}
            by_user = {await ask("episode-7", False) for _ in range(8)}
            assert by_header == by_user  # the header and `user` name the same session
            assert len(by_header) == 1
            home = by_header.pop()
            spread = {await ask(f"episode-{i}", True) for i in range(30)}
            assert len(spread) > 1  # sessions are spread over shards, not all pinned to one

            await fleet.kill(home)
            moved = [await ask("episode-7", True) for _ in range(8)]

    assert home not in moved
    assert len(set(moved)) == 1  # it moved to one other shard and stays there


async def test_multistep_episodes_through_the_router_all_complete_while_shards_die(
    tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    """sim-env multistep asks the policy (the router) for every step, each episode pinned to its shard by its id;
    the three shards that are home to episodes crash mid-run, answer a 503 burst and freeze. The faults are armed
    before the episodes start, on their homes, so each one hits whatever the speed of the run (armed after the
    first answers, a fast router had finished every episode before the burst and the kill met no episode)."""
    episodes, steps = 16, 10
    async with SimFleet(4, log_dir=tmp_path) as fleet:
        homes = Counter(_home(f"ep-{index}", fleet.names) for index in range(episodes))
        assert len(homes) >= 3, f"the episodes' homes: {dict(homes)}"
        crashing, bursting, frozen = (name for name, _ in homes.most_common(3))
        async with (
            await _router(tmp_path, [(s.name, s.endpoint) for s in fleet.shards]) as router,
            await spawn_env_server("multistep", log_path=tmp_path / "env.log") as env,
            EnvironmentClient(env.url) as client,
        ):
            await _ready(http, router, 4)
            # the most episodes' home serves `steps` calls of its >= 4 x `steps`, then exits mid-request
            await fleet.set_faults(crashing, crash_after_requests=steps)
            await fleet.set_faults(bursting, fail_next=5, error_status=503)
            fleet.hang(frozen)  # still routable until its probes fail: its episodes' first calls hang there

            async def episode(index: int) -> MultiStepResponse:
                values = [index + step for step in range(steps)]
                request = {"episode_id": f"ep-{index}", "values": values, "policy_url": router.url}
                return await client.run_episode(request, MultiStepResponse)

            replies = await within(asyncio.gather(*(episode(i) for i in range(episodes))), "every episode")
            crashed = await within(fleet.wait_exit(crashing), f"{crashing} to exit")
            fleet.resume(frozen)
            burst = await fleet.stats(bursting)
            ejections = await _metric(http, router, "rollout_ejections_total")
            cancelled = await _metric(http, router, "rollout_attempts_total", 'outcome="cancelled"')

    assert len(replies) == episodes
    assert all(reply.reward == 1.0 for reply in replies), [r.totals for r in replies if r.reward != 1.0]
    assert crashed == CRASH_EXIT_CODE, f"{crashing} exited {crashed}, not by its crash fault"
    assert burst.get("errors_503", 0) >= 1, "the 503 burst answered no request"
    assert ejections >= 1
    assert cancelled >= 1, "no attempt was taken off the frozen shard when it left the healthy set"


async def _stream_shard(tmp_path: Path, name: str, *args: str) -> tuple[ManagedProcess, str]:
    process = ManagedProcess(name, [sys.executable, "-P", STREAM_SHARD, *args], tmp_path / f"{name}.log")
    process.start()
    ready = await process.wait_ready_line("STREAM_SHARD_READY ", 30)
    return process, f"http://127.0.0.1:{ready['port']}"


async def test_a_stream_whose_shard_freezes_mid_stream_ends_with_an_error_event(
    tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    first, first_url = await _stream_shard(tmp_path, "stream-a", "--chunks", "400")
    second, second_url = await _stream_shard(tmp_path, "stream-b", "--chunks", "400")
    try:
        shards = [("stream-a", first_url), ("stream-b", second_url)]
        async with await _router(tmp_path, shards, "--read-timeout", "1") as router:
            await _ready(http, router, 2)
            processes = {"stream-a": first, "stream-b": second}
            body = {"prompt": "tell me a story", "stream": True}
            async with http.post(router.url + "/v1/completions", json=body) as response:
                assert response.status == 200
                frozen = response.headers[SHARD_HEADER]
                head = await within(response.content.readuntil(b"\n\n"), "the stream's first event")
                processes[frozen].hang()
                rest = await within(response.content.read(), "the end of the interrupted stream")
            interrupted = await _metric(http, router, "router_streams_interrupted_total")
            async with http.post(router.url + "/v1/completions", json={**body, "stream": False}) as response:
                after = response.headers[SHARD_HEADER], response.status
            processes[frozen].resume()
    finally:
        first.kill()
        second.kill()

    assert head.startswith(b"data: {")
    assert b"data: [DONE]" not in rest  # never passed off as a complete answer
    event = rest[rest.rindex(b"event: error") :]
    payload = json.loads(event.split(b"data: ", 1)[1])
    assert payload["error"]["type"] == "stream_interrupted"
    assert payload["error"]["shard"] == frozen
    assert interrupted == 1
    assert after == (next(n for n in processes if n != frozen), 200)  # the frozen shard was ejected


async def test_a_stream_retries_on_another_shard_before_its_first_byte(
    tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    sick, sick_url = await _stream_shard(tmp_path, "stream-sick", "--chunks", "5", "--fail-first", "1")
    live, live_url = await _stream_shard(tmp_path, "stream-live", "--chunks", "5")
    # a session whose own shard is the sick one, so the first attempt goes there
    session = next(f"s{i}" for i in range(1000) if _home(f"s{i}", ["stream-sick", "stream-live"]) == "stream-sick")
    try:
        shards = [("stream-sick", sick_url), ("stream-live", live_url)]
        async with await _router(tmp_path, shards) as router:
            await _ready(http, router, 2)
            body = {"prompt": "x", "stream": True, "user": session}
            async with http.post(router.url + "/v1/completions", json=body) as response:
                status, headers, raw = response.status, response.headers, await response.read()
            async with http.get(sick_url + "/admin/stats") as response:
                stats = await response.json()
    finally:
        sick.kill()
        live.kill()

    assert (status, headers[SHARD_HEADER], headers[ATTEMPTS_HEADER]) == (200, "stream-live", "2")
    assert raw.rstrip().endswith(b"data: [DONE]")
    assert b"injected" not in raw  # the sick shard's 503 never reached the client
    assert stats["errors_503"] == 1


def _home(session: str, names: list[str]) -> str:
    return max(names, key=lambda name: rendezvous_score(session, name))


async def test_the_access_log_has_no_bodies_headers_or_query_strings(
    tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    async with SimFleet(1, log_dir=tmp_path) as fleet:
        shard = fleet.shards[0]
        async with await _router(tmp_path, [(shard.name, shard.endpoint)]) as router:
            await _ready(http, router, 1)
            body = {"prompt": "the secret prompt PROMPT-7c1e", "max_tokens": 4}
            headers = {"Authorization": "Bearer sk-live-4f9a8b7c6d5e4f3a2b1c"}
            url = router.url + "/v1/completions?api_key=QUERY-KEY-91b2"
            async with http.post(url, json=body, headers=headers) as response:
                assert response.status == 200
            await router.stop()  # flush and close the log
    log = router.log_path.read_text()
    assert "POST /v1/completions 200" in log  # the request was logged...
    for secret in ("PROMPT-7c1e", "sk-live-4f9a8b7c6d5e4f3a2b1c", "QUERY-KEY-91b2"):
        assert secret not in log  # ...without its body, its headers or its query string
