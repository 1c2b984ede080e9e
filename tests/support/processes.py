"""Child processes for fixtures: started with a log file, waited for by polling, stopped by pid.

Every server a fixture starts goes through :class:`ManagedProcess`, so teardown always signals exactly the pid it
started (never a process name), and a failure can show the tail of the log that explains it.
"""

from __future__ import annotations

import atexit
import os
import shutil
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

_LIVE: set[ManagedProcess] = set()  # started and not yet reaped: stopped at exit if a teardown never ran


def _die_with_parent_prefix() -> list[str]:
    """``setpriv --pdeathsig KILL``: the child is killed when the thread that started it dies.

    That covers what no teardown or atexit can: pytest killed by a CI timeout or SIGKILL would otherwise leave etcd,
    kube-apiserver and prometheus running. The death signal follows the starting *thread*, so it is only used from
    the main thread (a worker thread, e.g. ``asyncio.to_thread``, may end long before the session does).
    """
    setpriv = shutil.which("setpriv")
    if setpriv is None or threading.current_thread() is not threading.main_thread():
        return []
    return [setpriv, "--pdeathsig", "KILL", "--"]  # nobody is left to wait for a graceful exit


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now (the kernel picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


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

    @property
    def pid(self) -> int | None:
        """The pid of the running process, if started."""
        return self.popen.pid if self.popen is not None else None

    @property
    def running(self) -> bool:
        """True while the started process has not exited."""
        return self.popen is not None and self.popen.poll() is None

    def start(self) -> None:
        """Start the process; its stdout and stderr go to the log file."""
        if self.running:
            raise RuntimeError(f"{self.name} is already running (pid {self.pid})")
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            log.write(f"\n=== {time.strftime('%H:%M:%S')} starting: {' '.join(self.argv)}\n".encode())
            log.flush()
            self.popen = subprocess.Popen(
                [*_die_with_parent_prefix(), *self.argv],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self.env,
                start_new_session=True,  # a Ctrl-C in the terminal reaches pytest, which then stops us in order
            )
        _LIVE.add(self)

    def stop(self, timeout: float = 15.0) -> None:
        """SIGTERM (and SIGCONT) the pid and wait; SIGKILL it if it does not exit in time. Idempotent."""
        if self.popen is None or self.popen.poll() is not None:
            _LIVE.discard(self)
            return
        self.popen.send_signal(signal.SIGTERM)
        self.popen.send_signal(signal.SIGCONT)  # a frozen (SIGSTOPped) process acts on its SIGTERM only once resumed
        try:
            self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            self.popen.wait(timeout)
        _LIVE.discard(self)

    def kill(self) -> None:
        """SIGKILL the pid at once (a crash, for failure-injection tests) and reap it."""
        if self.popen is not None and self.popen.poll() is None:
            self.popen.kill()
            self.popen.wait()
        _LIVE.discard(self)

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
    deadline = start + timeout
    while True:
        if process is not None:
            process.check_alive()
        if check():
            return time.monotonic() - start
        if time.monotonic() > deadline:
            detail = f"; log {process.log_path}, last lines:\n{process.tail()}" if process is not None else ""
            raise TimeoutError(f"{what} not ready within {timeout:.0f} s{detail}")
        time.sleep(interval)


@atexit.register
def _stop_leftovers() -> None:
    """Last resort if teardown did not run (e.g. an interpreter exit mid-session): stop what we started."""
    for proc in list(_LIVE):
        proc.stop(timeout=5)
