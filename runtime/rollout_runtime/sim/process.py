"""Child processes for the sim, the tests and the benchmarks: one wrapper, stopped by the pid it started.

Every server the sim fleet, a fixture or a benchmark starts (sim shards, sim environment servers, etcd,
kube-apiserver, the operator, prometheus) is a :class:`ManagedProcess`: started in its own session with stdout and
stderr appended to one log file, signalled only by the pid it started (never by a process name), and stopped with
SIGCONT (a SIGSTOPped process cannot act on SIGTERM), SIGTERM, then SIGKILL. Readiness is either a ready line the
child prints (:meth:`ManagedProcess.wait_ready_line`) or a check polled with :func:`wait_until` / :func:`until`;
both fail with the tail of the log when the child exits first. The interface is synchronous for fixtures and has
``*_async`` twins for event loops: waiting for an exit there uses a pidfd, so no thread and no polling.

Nothing is left behind: a child is killed when the main thread that started it dies (``setpriv --pdeathsig``), and
whatever is still running at interpreter exit is stopped (a frozen one resumed first).
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, Self

__all__ = [
    "ManagedProcess",
    "ServerProcess",
    "free_port",
    "free_ports",
    "spawn_python_server",
    "tail",
    "until",
    "wait_until",
]

_LIVE: set[ManagedProcess] = set()  # started and not yet reaped: stopped at exit if a teardown never ran


def _die_with_parent_prefix() -> list[str]:
    """``setpriv --pdeathsig KILL``: the child is killed when the thread that started it dies.

    That covers what no teardown or atexit can: a parent killed by a CI timeout or SIGKILL would otherwise leave
    etcd, kube-apiserver, prometheus or a frozen sim shard running. The death signal follows the starting *thread*,
    so it is only used from the main thread (a worker thread, e.g. ``asyncio.to_thread``, may end long before).
    """
    setpriv = shutil.which("setpriv")
    if setpriv is None or threading.current_thread() is not threading.main_thread():
        return []
    return [setpriv, "--pdeathsig", "KILL", "--"]  # nobody is left to wait for a graceful exit


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now (the kernel picks it)."""
    return free_ports(1)[0]


def free_ports(count: int) -> list[int]:
    """Several distinct free ports (held open together so the kernel cannot hand out one twice)."""
    socks = [socket.socket(socket.AF_INET, socket.SOCK_STREAM) for _ in range(count)]
    try:
        for sock in socks:
            sock.bind(("127.0.0.1", 0))
        return [int(sock.getsockname()[1]) for sock in socks]
    finally:
        for sock in socks:
            sock.close()


def tail(path: Path, lines: int = 40) -> str:
    """The last lines of a log file, or a note that it does not exist."""
    try:
        text = path.read_text(errors="replace")
    except FileNotFoundError:
        return f"(no log at {path})"
    return "\n".join(text.splitlines()[-lines:])


class ManagedProcess:
    """One server process: restartable, logging to one file (appended across restarts), stopped by its pid."""

    def __init__(
        self, name: str, argv: Sequence[str | os.PathLike[str]], log_path: Path, env: Mapping[str, str] | None = None
    ) -> None:
        self.name = name
        self.argv = [os.fspath(arg) for arg in argv]
        self.log_path = log_path
        self.env = dict(env) if env is not None else None
        self.popen: subprocess.Popen[bytes] | None = None
        self.stopped = False
        """True while SIGSTOPped by :meth:`hang`."""
        self._log_offset = 0

    @property
    def pid(self) -> int | None:
        """The pid of the running process, if started."""
        return self.popen.pid if self.popen is not None else None

    @property
    def running(self) -> bool:
        """True while the started process has not exited."""
        return self.popen is not None and self.popen.poll() is None

    @property
    def returncode(self) -> int | None:
        """The exit status once reaped (negative: the signal that ended it)."""
        return self.popen.returncode if self.popen is not None else None

    def start(self) -> None:
        """Start the process; its stdout and stderr go to the log file."""
        if self.running:
            raise RuntimeError(f"{self.name} is already running (pid {self.pid})")
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            log.write(f"\n=== {time.strftime('%H:%M:%S')} starting: {' '.join(self.argv)}\n".encode())
            log.flush()
            self._log_offset = log.tell()
            self.popen = subprocess.Popen(
                [*_die_with_parent_prefix(), *self.argv],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self.env,
                start_new_session=True,  # a Ctrl-C in the terminal reaches the parent, which then stops us in order
            )
        self.stopped = False
        _LIVE.add(self)

    # -- signals --------------------------------------------------------------------------------------------

    def _signal(self, signum: int) -> None:
        if self.popen is not None and self.popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.popen.pid, signum)

    def hang(self) -> None:
        """SIGSTOP the pid: the kernel still accepts connections on its ports, nothing answers."""
        if not self.running:
            raise RuntimeError(f"cannot hang {self.name}: it is not running")
        self._signal(signal.SIGSTOP)
        self.stopped = True

    def resume(self) -> None:
        """SIGCONT the pid (harmless when it is not stopped)."""
        self._signal(signal.SIGCONT)
        self.stopped = False

    def _reaped(self) -> None:
        self.stopped = False
        _LIVE.discard(self)

    def stop(self, timeout: float = 15.0) -> None:
        """SIGCONT and SIGTERM the pid and wait; SIGKILL it if it does not exit in time. Idempotent."""
        if self.popen is None or self.popen.poll() is not None:
            self._reaped()
            return
        self.resume()
        self._signal(signal.SIGTERM)
        try:
            self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            self.popen.wait(timeout)
        self._reaped()

    def kill(self) -> None:
        """SIGKILL the pid at once (a crash, for failure injection) and reap it."""
        if self.popen is not None and self.popen.poll() is None:
            self.popen.kill()
            self.popen.wait()
        self._reaped()

    async def wait_async(self) -> int:
        """Wait for the process to exit (without blocking the loop) and reap it; return its status."""
        if self.popen is None:
            raise RuntimeError(f"{self.name} was never started")
        popen = self.popen
        if (code := popen.poll()) is None:
            try:
                pidfd = os.pidfd_open(popen.pid)
            except (AttributeError, OSError):  # no pidfd here, or reaped meanwhile: a thread waits instead
                code = await asyncio.to_thread(popen.wait)
            else:
                try:
                    await _readable(pidfd)
                finally:
                    os.close(pidfd)
                code = popen.wait()
        self._reaped()
        return code

    async def stop_async(self, grace_seconds: float = 15.0) -> int | None:
        """:meth:`stop` for an event loop: SIGCONT, SIGTERM, SIGKILL after ``grace_seconds`` (at once for 0)."""
        if self.popen is None:
            return None
        if self.popen.poll() is None:
            self.resume()
            self._signal(signal.SIGTERM if grace_seconds > 0 else signal.SIGKILL)
            with contextlib.suppress(TimeoutError):
                return await asyncio.wait_for(self.wait_async(), grace_seconds)
            self._signal(signal.SIGKILL)
        return await self.wait_async()

    async def kill_async(self) -> int | None:
        """:meth:`kill` for an event loop; the exit status (None if never started)."""
        if self.popen is None:
            return None
        self._signal(signal.SIGKILL)
        return await self.wait_async()

    # -- readiness and logs ---------------------------------------------------------------------------------

    def tail(self, lines: int = 40) -> str:
        """The last lines of this process's log."""
        return tail(self.log_path, lines)

    def check_alive(self) -> None:
        """Raise with the log tail if the process has exited (used while waiting for readiness)."""
        if self.popen is None:
            raise RuntimeError(f"{self.name} was never started")
        code = self.popen.poll()
        if code is not None:
            raise RuntimeError(f"{self.name} exited with code {code}; log {self.log_path}, last lines:\n{self.tail()}")

    def ready_line(self, prefix: str) -> dict[str, Any] | None:
        """The JSON after ``prefix`` on a line this start of the process logged, if it has logged one yet."""
        try:
            with self.log_path.open("rb") as log:
                log.seek(self._log_offset)
                text = log.read().decode(errors="replace")
        except FileNotFoundError:
            return None
        for line in text.splitlines():
            if line.startswith(prefix):
                found: dict[str, Any] = json.loads(line[len(prefix) :])
                return found
        return None

    async def wait_ready_line(self, prefix: str, timeout_seconds: float) -> dict[str, Any]:
        """Wait for the child's ready line (``prefix`` + JSON, e.g. the port it bound); fail fast if it exits."""
        found: dict[str, Any] = {}

        def ready() -> bool:
            line = self.ready_line(prefix)
            found.update(line or {})
            return line is not None

        await until(ready, timeout_seconds=timeout_seconds, what=f"{self.name} ready line", process=self)
        return found


async def _readable(fd: int) -> None:
    """Wait until ``fd`` is readable (a pidfd is once its process has exited)."""
    loop = asyncio.get_running_loop()
    ready = loop.create_future()

    def wake() -> None:
        if not ready.done():
            ready.set_result(None)

    loop.add_reader(fd, wake)
    try:
        await ready
    finally:
        loop.remove_reader(fd)


def _polls(what: str, timeout: float, process: ManagedProcess | None) -> Iterator[None]:
    """One step per poll until ``timeout``: fail fast with the log's tail if ``process`` dies, then on the deadline."""
    deadline = time.monotonic() + timeout
    while True:
        if process is not None:
            process.check_alive()
        yield
        if time.monotonic() > deadline:
            detail = f"; log {process.log_path}, last lines:\n{process.tail()}" if process is not None else ""
            raise TimeoutError(f"{what} not ready within {timeout:g} s{detail}")


def wait_until(
    check: Callable[[], bool],
    *,
    timeout: float,
    what: str,
    process: ManagedProcess | None = None,
    interval: float = 0.05,
) -> float:
    """Poll ``check`` until it is true; return the seconds it took. Fail fast if ``process`` dies meanwhile."""
    start = time.monotonic()
    for _ in _polls(what, timeout, process):
        if check():
            return time.monotonic() - start
        time.sleep(interval)  # polling an external process: there is no event to wait for
    raise AssertionError("unreachable")  # pragma: no cover - _polls raises on its deadline


async def until(
    check: Callable[[], bool | Awaitable[bool]],
    *,
    timeout_seconds: float,
    what: str,
    process: ManagedProcess | None = None,
    interval: float = 0.2,
) -> float:
    """:func:`wait_until` for an event loop: ``check`` may be a coroutine function; polls back off to ``interval``."""
    start, delay = time.monotonic(), 0.01
    for _ in _polls(what, timeout_seconds, process):
        done = check()
        if done if isinstance(done, bool) else await done:
            return time.monotonic() - start
        await asyncio.sleep(delay)  # polling an external process: there is no event to await
        delay = min(delay * 2, interval)
    raise AssertionError("unreachable")  # pragma: no cover - _polls raises on its deadline


@atexit.register
def _stop_leftovers() -> None:
    """Last resort if teardown did not run (e.g. an interpreter exit mid-session): stop what we started."""
    for proc in list(_LIVE):
        proc.stop(timeout=5)


@dataclass
class ServerProcess:
    """A server subprocess that announced its port on a ready line (see :func:`spawn_python_server`)."""

    host: str
    port: int
    log_path: Path
    process: ManagedProcess = field(repr=False)

    @property
    def pid(self) -> int:
        pid = self.process.pid
        assert pid is not None  # spawn_python_server returns started processes only
        return pid

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def running(self) -> bool:
        return self.process.running

    async def kill(self) -> None:
        """``kill -9`` this pid (no cleanup runs: that is the point) and reap it."""
        await self.process.kill_async()

    async def stop(self, timeout_seconds: float = 15.0) -> None:
        """SIGTERM (graceful), then SIGKILL if it does not exit in time."""
        await self.process.stop_async(timeout_seconds)

    def log_tail(self, lines: int = 40) -> str:
        return self.process.tail(lines)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.stop()


async def spawn_python_server(
    name: str,
    module: str,
    args: Sequence[str],
    *,
    ready_prefix: str,
    log_path: Path | str | None,
    ready_timeout_seconds: float,
) -> tuple[ManagedProcess, Path, dict[str, Any]]:
    """Run ``python -m <module> <args>`` (unbuffered, logging to ``log_path``, a fresh temporary file when None)
    and wait for its ready line; a child that never gets ready is killed. Returns the process, its log and the
    ready line's JSON (``port``...)."""
    if log_path is None:
        handle, temporary = tempfile.mkstemp(prefix=f"{name.replace(' ', '-')}-", suffix=".log")
        os.close(handle)
        log_path = temporary
    log = Path(log_path)
    argv = [sys.executable, "-m", module, *args]
    process = ManagedProcess(name, argv, log, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    process.start()
    try:
        ready = await process.wait_ready_line(ready_prefix, ready_timeout_seconds)
    except BaseException:
        await process.kill_async()
        raise
    return process, log, ready
