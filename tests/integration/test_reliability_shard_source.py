"""KubernetesShardSource against an API server that misbehaves on cue: 410 Gone (in the stream and as a status),
a watch cut off mid-event, garbage in the stream, and list errors. The source must keep following the fleet.

The server is a small real HTTP server on 127.0.0.1 speaking the list/watch protocol for one RolloutFleet; each
fault is queued into the open watch stream (or armed for the next request), then the fleet's status changes, and
the test waits for the source to deliver the new healthy set.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from rollout_runtime.shards import HealthySet, KubernetesShardSource
from support.deadlines import within

PATH = "/apis/rolloutfleet.dev/v1alpha1/namespaces/ns/rolloutfleets"


class FakeApiServer:
    """One RolloutFleet, served by list and watch; faults are queued into watches or armed for the next request."""

    def __init__(self) -> None:
        self.rv = 1
        self.fleet: dict[str, Any] = {
            "apiVersion": "rolloutfleet.dev/v1alpha1",
            "kind": "RolloutFleet",
            "metadata": {"name": "a", "namespace": "ns", "resourceVersion": "1"},
            "spec": {"shardSelector": {}},
            "status": {"revision": "r1", "shards": [{"name": "s1", "endpoint": "http://10.0.0.1:8000"}]},
        }
        self.watches: list[asyncio.Queue[tuple[str, Any]]] = []
        self.history: list[tuple[int, dict[str, Any]]] = []
        """Every event with its resourceVersion: a watch from version v first replays those after v."""
        self.watch_opened = asyncio.Event()
        self.next_watch_status: int | None = None
        self.next_list_statuses: list[int] = []
        self.lists = 0
        self.watch_requests = 0

    def set_shards(self, revision: str, *names: str) -> None:
        self.rv += 1
        self.fleet["metadata"]["resourceVersion"] = str(self.rv)
        self.fleet["status"] = {
            "revision": revision,
            "shards": [{"name": n, "endpoint": f"http://10.0.0.{i + 1}:8000"} for i, n in enumerate(names)],
        }
        event = {"type": "MODIFIED", "object": json.loads(json.dumps(self.fleet))}
        self.history.append((self.rv, event))
        self.push(("event", event))

    def push(self, item: tuple[str, Any]) -> None:
        for queue in self.watches:
            queue.put_nowait(item)

    async def handle(self, request: web.Request) -> web.StreamResponse:
        if request.query.get("watch") not in ("true", "True", "1"):
            self.lists += 1
            if self.next_list_statuses:
                status = self.next_list_statuses.pop(0)
                return web.json_response({"kind": "Status", "code": status, "message": "fault"}, status=status)
            return web.json_response(
                {"kind": "RolloutFleetList", "metadata": {"resourceVersion": str(self.rv)}, "items": [self.fleet]}
            )
        self.watch_requests += 1
        if self.next_watch_status is not None:
            status, self.next_watch_status = self.next_watch_status, None
            body = {"kind": "Status", "code": status, "reason": "Expired", "message": "too old resource version"}
            return web.json_response(body, status=status)
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        response.enable_chunked_encoding()
        await response.prepare(request)
        queue: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()
        since = int(request.query.get("resourceVersion") or 0)
        for version, event in self.history:
            if version > since:
                queue.put_nowait(("event", event))
        self.watches.append(queue)
        self.watch_opened.set()
        try:
            while True:
                kind, payload = await queue.get()
                if kind == "event":
                    await response.write(json.dumps(payload).encode() + b"\n")
                elif kind == "error410":
                    status = {"kind": "Status", "code": 410, "reason": "Expired", "message": "too old resource version"}
                    await response.write(json.dumps({"type": "ERROR", "object": status}).encode() + b"\n")
                    break
                elif kind == "garbage":
                    await response.write(b"this is not json\n")
                elif kind == "drop":
                    await response.write(b'{"type": "MODIFIED", "object": {"metadata"')
                    assert request.transport is not None
                    request.transport.close()  # cut off mid-event, mid-chunk
                    return response
            await response.write_eof()
            return response
        finally:
            self.watches.remove(queue)


@pytest.fixture
async def apiserver(tmp_path: Path) -> AsyncIterator[tuple[FakeApiServer, Path]]:
    fake = FakeApiServer()
    app = web.Application()
    app.router.add_get(PATH, fake.handle)
    runner = web.AppRunner(app, handle_signals=False, shutdown_timeout=0.1)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "fake", "cluster": {"server": f"http://127.0.0.1:{port}"}}],
                "users": [{"name": "fake", "user": {"token": "x"}}],
                "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "fake"}}],
                "current-context": "fake",
            }
        )
    )
    try:
        yield fake, kubeconfig
    finally:
        await runner.cleanup()


async def _next(snapshots: AsyncIterator[HealthySet]) -> HealthySet:
    return await within(anext(snapshots), "the source's next snapshot", 30)


async def _watching(fake: FakeApiServer) -> None:
    fake.watch_opened.clear()
    while not fake.watches:
        await fake.watch_opened.wait()
        fake.watch_opened.clear()


@pytest.mark.parametrize("fault", ["error410", "http410", "drop", "garbage", "list-errors"])
async def test_the_source_keeps_following_the_fleet_through_a_watch_fault(
    apiserver: tuple[FakeApiServer, Path], fault: str, caplog: pytest.LogCaptureFixture
) -> None:
    fake, kubeconfig = apiserver
    caplog.set_level(logging.INFO, logger="rollout_runtime.shards.kubernetes")
    source = KubernetesShardSource(
        "a", "ns", kubeconfig=kubeconfig, reconnect_initial_seconds=0.05, reconnect_max_seconds=0.2
    )
    async with contextlib.aclosing(source.snapshots()) as snapshots:
        first = await _next(snapshots)
        assert (first.revision, first.names()) == ("r1", frozenset({"s1"}))
        # The source watches only while asked for its next snapshot: ask, then wait for its watch to open.
        second_task = asyncio.create_task(_next(snapshots))
        await _watching(fake)
        if fault == "http410":
            fake.next_watch_status = 410
            fake.push(("error410", None))  # end this watch so the next request gets the armed 410 status
        elif fault == "list-errors":
            fake.next_list_statuses = [503, 500, 429]
            fake.push(("drop", None))
        else:
            fake.push((fault, None))
        fake.set_shards("r2", "s1", "s2")  # may land in a dead stream: the re-list must pick it up
        second = await second_task
        assert (second.revision, second.names()) == ("r2", frozenset({"s1", "s2"}))

        third_task = asyncio.create_task(_next(snapshots))
        await _watching(fake)
        fake.set_shards("r3", "s2")
        third = await third_task
        assert (third.revision, third.names()) == ("r3", frozenset({"s2"}))
    assert source.relists >= 2
    if fault in ("error410", "http410"):
        assert "410 Gone" in caplog.text
