"""Real vLLM servers on 127.0.0.1 for the real-vLLM tier, the benchmarks and ``scripts/demo --shards vllm``.

vLLM is not one process: the OpenAI API server spawns an engine core process, which on CPU spawns a worker
(``VLLM::Worker``) that runs the model. Each server is therefore started in its own session (``setsid``: its process
group is its pid) and stopped by process group: killing only the API server leaves the engine core alive as an
orphan holding ~2 GB. Faults address each part by pid: :meth:`VllmServer.kill_api_server` (SIGKILL of the API
server, the engine is orphaned until :meth:`stop` sweeps the group), :meth:`VllmServer.kill_engine` (SIGKILL of the
engine core: in-flight requests get 500 and the server exits by itself), :meth:`VllmServer.freeze_engine`
(SIGSTOP of the engine core: ``/health`` keeps answering 200 while every generation hangs).

The server is ``python -m vllm.entrypoints.openai.api_server`` from the tool's venv (``scripts/install-tools.sh
vllm``; the wheel's ``vllm`` command crashes), serving the tiny model of :mod:`rollout_runtime.vllm.tiny_model` with
the dev-mode RL endpoints on (``VLLM_SERVER_DEV_MODE=1``: ``/pause``, ``/resume``, ``/collective_rpc``,
``/update_weight_version``, ``/weight_info``), offline (``HF_HUB_OFFLINE=1``) and without usage reporting.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

import aiohttp

from rollout_runtime.sim.process import ManagedProcess, free_ports, until
from rollout_runtime.vllm import guard
from rollout_runtime.vllm.guard import READY_PREFIX

__all__ = [
    "ENGINE_PROCESS_PREFIX",
    "MAX_MODEL_LEN",
    "MODEL_NAME",
    "VllmServer",
    "generate_tiny_model",
    "group_members",
    "server_argv",
    "server_env",
]

MODEL_NAME: Final[str] = "tiny-llama"
MAX_MODEL_LEN: Final[int] = 256
ENGINE_PROCESS_PREFIX: Final[str] = "VLLM::EngineCor"
"""The engine core's process title as /proc/<pid>/comm shows it (15 characters of ``VLLM::EngineCore``)."""
TINY_MODEL_SCRIPT: Final[Path] = Path(__file__).with_name("tiny_model.py")
GUARD_SCRIPT: Final[str] = guard.__file__
"""Run as a script, not ``-m``: the package's ``__init__`` would import it again before it runs."""
_LIVE_GROUPS: set[int] = set()  # process groups started and not yet seen empty: swept at interpreter exit


@atexit.register
def _sweep_groups() -> None:
    """Last resort when a teardown did not run: SIGKILL every group we started (an engine core outlives its API
    server, and ``setpriv --pdeathsig`` covers only the API server)."""
    for pgid in list(_LIVE_GROUPS):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGKILL)


def server_argv(python: Path, model_dir: Path, port: int, extra: Sequence[str] = ()) -> list[str]:
    """The command line: the issue's recipe for a CPU-only machine (float32, eager, a 256-token context and a
    256 MB KV cache, so three servers fit beside the rest of the suite)."""
    return [
        os.fspath(python),
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        os.fspath(model_dir),
        "--served-model-name",
        MODEL_NAME,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--dtype",
        "float32",
        "--max-model-len",
        str(MAX_MODEL_LEN),
        "--enforce-eager",
        "--kv-cache-memory-bytes",
        "256M",
        "--seed",
        "0",
        *extra,
    ]


def server_env(base: Mapping[str, str] | None = None, cpu_threads: int = 1) -> dict[str, str]:
    """The environment: loopback only, offline, no usage reporting, dev-mode RL endpoints, ``cpu_threads`` threads."""
    env = dict(os.environ if base is None else base)
    env.update(
        {
            "VLLM_HOST_IP": "127.0.0.1",
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "VLLM_NO_USAGE_STATS": "1",
            "DO_NOT_TRACK": "1",
            "VLLM_SERVER_DEV_MODE": "1",
            "OMP_NUM_THREADS": str(cpu_threads),
            "VLLM_CPU_OMP_THREADS_BIND": "nobind",
            "PYTHONUNBUFFERED": "1",
        }
    )
    return env


class GuardedProcess(ManagedProcess):
    """A :class:`ManagedProcess` run under :mod:`rollout_runtime.vllm.guard`: the guard leads the process group and
    kills all of it when this process's end of its stdin pipe closes (this interpreter exited, teardown or not)."""

    def __init__(self, name: str, argv: Sequence[str], log_path: Path, env: Mapping[str, str]) -> None:
        super().__init__(name, [sys.executable, GUARD_SCRIPT, *argv], log_path, env)
        self._lifeline: int | None = None

    def start(self) -> None:
        if self.running:
            raise RuntimeError(f"{self.name} is already running (pid {self.pid})")
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        read_end, self._lifeline = os.pipe()
        os.set_inheritable(self._lifeline, False)
        try:
            with self.log_path.open("ab") as log:
                log.write(f"\n=== {time.strftime('%H:%M:%S')} starting: {' '.join(self.argv)}\n".encode())
                log.flush()
                self._log_offset = log.tell()
                self.popen = subprocess.Popen(
                    self.argv, stdin=read_end, stdout=log, stderr=log, env=self.env, start_new_session=True
                )
        finally:
            os.close(read_end)
        self.stopped = False

    def release(self) -> None:
        """Close our end of the lifeline (after the group is gone; closing it earlier kills the group)."""
        if self._lifeline is not None:
            os.close(self._lifeline)
            self._lifeline = None


def group_members(pgid: int) -> list[int]:
    """The live (not zombie) pids of process group ``pgid``, read from /proc."""
    members = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        # pid (comm) state ppid pgrp ...: comm may hold spaces and parentheses, so split after its last ')'.
        fields = stat[stat.rfind(")") + 2 :].split()
        if len(fields) > 2 and fields[0] != "Z" and int(fields[2]) == pgid:
            members.append(int(entry))
    return members


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def generate_tiny_model(python: Path, out: Path, *, seed: int = 0, timeout_seconds: float = 300.0) -> Path:
    """Write the tiny model's two weight sets under ``out`` with the tool's interpreter (once: an existing v2 is
    reused); return the v1 directory. About 30 s on 2 busy cores, most of it importing torch and transformers."""
    if not (out / "v2" / "model.safetensors").is_file():
        out.mkdir(parents=True, exist_ok=True)
        argv = [os.fspath(python), os.fspath(TINY_MODEL_SCRIPT), os.fspath(out), "--seed", str(seed)]
        env = server_env()
        done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=timeout_seconds, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"generating the tiny model failed ({done.returncode}): {done.stderr[-2000:]}")
    return out / "v1"


@dataclass
class VllmServer:
    """One vLLM server (API server + engine core) on a fixed port, restartable, stopped by its process group."""

    name: str
    python: Path
    model_dir: Path
    log_path: Path
    port: int = 0
    extra_args: tuple[str, ...] = ()
    cpu_threads: int = 1
    process: GuardedProcess = field(init=False)
    _api_pid: int | None = field(init=False, default=None)

    def __post_init__(self) -> None:
        if not self.port:
            self.port = free_ports(1)[0]
        argv = server_argv(self.python, self.model_dir, self.port, self.extra_args)
        self.process = GuardedProcess(self.name, argv, self.log_path, env=server_env(cpu_threads=self.cpu_threads))

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pgid(self) -> int | None:
        """The process group: the guard's pid (it leads a new session)."""
        return self.process.pid

    @property
    def pid(self) -> int | None:
        """The API server's pid, once the guard has announced it."""
        if self._api_pid is None:
            line = self.process.ready_line(READY_PREFIX)
            self._api_pid = int(line["pid"]) if line else None
        return self._api_pid

    @property
    def running(self) -> bool:
        """True while the API server process lives."""
        pid = self.pid
        return pid is not None and pid in self.members()

    def members(self) -> list[int]:
        """Every live process of the server's group: the guard, the API server, its engine core and helpers."""
        return group_members(self.pgid) if self.pgid is not None else []

    def engine_pids(self) -> list[int]:
        """The engine core process(es) of this server."""
        return [pid for pid in self.members() if _comm(pid).startswith(ENGINE_PROCESS_PREFIX)]

    # -- lifecycle ------------------------------------------------------------------------------------------

    def start(self) -> None:
        """Start the server (on the same port after a stop); see :meth:`wait_ready`."""
        self._api_pid = None
        self.process.start()
        assert self.pgid is not None
        _LIVE_GROUPS.add(self.pgid)

    async def healthy(self) -> bool:
        """``GET /health`` answers 200 (vLLM's readiness; not liveness: a frozen engine keeps answering 200)."""
        try:
            timeout = aiohttp.ClientTimeout(total=2.0)
            async with aiohttp.ClientSession(timeout=timeout) as session, session.get(f"{self.url}/health") as answer:
                return answer.status == 200
        except (aiohttp.ClientError, TimeoutError):
            return False

    async def wait_ready(self, timeout_seconds: float = 240.0) -> float:
        """Wait for ``/health`` 200; fail with the log's tail if the server exits first. Returns the seconds."""

        async def ready() -> bool:
            if self.pid is not None and not self.running:
                raise RuntimeError(f"{self.name} exited while starting; log {self.log_path}:\n{self.process.tail()}")
            return await self.healthy()

        what = f"{self.name} /health"
        return await until(ready, timeout_seconds=timeout_seconds, what=what, process=self.process)

    def signal_group(self, signum: int) -> None:
        """Send ``signum`` to every process of the server's group."""
        if self.pgid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.pgid, signum)

    async def wait_group_gone(self, timeout_seconds: float) -> bool:
        """Wait (polling /proc) until no process of the group is left; reap the API server. False on timeout."""
        deadline = time.monotonic() + timeout_seconds
        while True:
            if self.process.popen is not None:
                self.process.popen.poll()
            if not self.members():
                _LIVE_GROUPS.discard(self.pgid or 0)
                return True
            if time.monotonic() > deadline:
                return False
            await asyncio.sleep(0.05)  # polling other processes' exits: there is no event for a group

    async def stop(self, grace_seconds: float = 10.0) -> None:
        """SIGCONT and SIGTERM the whole group, SIGKILL what is left after ``grace_seconds``; nothing is orphaned."""
        if self.pgid is None:
            return
        self.signal_group(signal.SIGCONT)
        self.signal_group(signal.SIGTERM)
        if not await self.wait_group_gone(grace_seconds):
            self.signal_group(signal.SIGKILL)
            await self.wait_group_gone(30.0)
        if self.process.popen is not None and self.process.popen.poll() is None:
            await self.process.kill_async()
        with contextlib.suppress(ChildProcessError):
            await self.process.wait_async()
        self.process.release()

    # -- faults ---------------------------------------------------------------------------------------------

    def kill_api_server(self) -> int:
        """SIGKILL the API server only (its engine core stays, orphaned); returns the pid killed."""
        pid = self._require_pid()
        os.kill(pid, signal.SIGKILL)
        return pid

    def terminate(self) -> int:
        """SIGTERM the API server (what Kubernetes sends first); returns the pid signalled."""
        pid = self._require_pid()
        os.kill(pid, signal.SIGTERM)
        return pid

    def kill_engine(self) -> list[int]:
        """SIGKILL the engine core (the API server notices and exits by itself); returns the pids killed."""
        return self._signal_engine(signal.SIGKILL)

    def freeze_engine(self) -> list[int]:
        """SIGSTOP the engine core: ``/health`` still answers 200, generations hang."""
        return self._signal_engine(signal.SIGSTOP)

    def thaw_engine(self) -> list[int]:
        """SIGCONT the engine core."""
        return self._signal_engine(signal.SIGCONT)

    def _signal_engine(self, signum: int) -> list[int]:
        pids = self.engine_pids()
        if not pids:
            raise RuntimeError(f"{self.name} has no engine core process (members {self.members()})")
        for pid in pids:
            os.kill(pid, signum)
        return pids

    def _require_pid(self) -> int:
        if self.pid is None or not self.running:
            raise RuntimeError(f"{self.name} is not running")
        return self.pid

    def rss_bytes(self) -> int:
        """The resident memory of the whole group (API server + engine core), from /proc."""
        total = 0
        for pid in self.members():
            with contextlib.suppress(OSError, ValueError, IndexError):
                total += int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        return total
