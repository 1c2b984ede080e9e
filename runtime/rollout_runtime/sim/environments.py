"""Two example environment servers: a single-step arithmetic verifier and a multi-step sandboxed sum.

- :class:`ArithmeticVerifier` (kind ``verifier``): the request carries a problem (``"17 + 25"``) and either the
  model's answer or a generation shard's URL to ask; the reward is 1.0 when the last integer of the answer is
  right, else 0.0. A failing shard becomes a dependency failure (retryable by its status).
- :class:`MultiStepEnvironment` (kind ``multistep``): applies one value per step to a running total inside a
  "sandbox" (local, or a remote tool server at ``tool_url``), records a checkpointable state after every step,
  releases the sandbox through the cleanup context, and verifies the result in a replay step. With
  ``restart_only`` it behaves like an episode whose agent cannot capture its part: it starts over after a crash.
"""

from __future__ import annotations

import asyncio
import functools
import json
import re
import uuid
from typing import Annotated, Any, Final, Self

import aiohttp
from aiohttp import web
from pydantic import Field, model_validator

from rollout_runtime.environment import (
    BaseEnvironmentServer,
    EnvironmentMetrics,
    EnvironmentServerConfig,
    EpisodeContext,
    EpisodeRequest,
    EpisodeResponse,
    ProtocolState,
    dependency_episode_failure,
    handled_episode_failure,
    raise_for_dependency_status,
)
from rollout_runtime.redaction import safe_message
from rollout_runtime.sim.shard import arithmetic

__all__ = [
    "ArithmeticRequest",
    "ArithmeticResponse",
    "ArithmeticVerifier",
    "MultiStepEnvironment",
    "MultiStepRequest",
    "MultiStepResponse",
    "last_integer",
    "problem_value",
]

_PROBLEM = re.compile(r"^\s*(-?\d{1,9})\s*([+\-*])\s*(-?\d{1,9})\s*$")
_INTEGER = re.compile(r"-?\d+")
MAX_REPLY_BYTES: Final[int] = 64 * 1024
"""Bound on a dependency's reply (the generation server, the tool server) the sim environments read."""
_DEPENDENCY_TIMEOUT = aiohttp.ClientTimeout(total=30.0, sock_connect=5.0)


def problem_value(problem: str) -> int:
    """The value of ``"<int> <+|-|*> <int>"``; ValueError for anything else (nothing is ever eval'd).

    The sim model's :func:`~rollout_runtime.sim.shard.expected_answer` is the same value as text.
    """
    match = _PROBLEM.fullmatch(problem)
    if match is None:
        raise ValueError(f"not a '<int> <op> <int>' problem: {problem[:100]!r}")
    return arithmetic(int(match[1]), match[2], int(match[3]))


def last_integer(text: str) -> int | None:
    """The last integer in a model's answer (models explain before they conclude), or None."""
    found = _INTEGER.findall(text)
    return int(found[-1]) if found else None


class _DependencySession:
    """One lazily created client session per server, closed with the app."""

    def __init__(self) -> None:
        self._session: aiohttp.ClientSession | None = None

    def get(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=_DEPENDENCY_TIMEOUT)
        return self._session

    async def close(self, _: object = None) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


# -- single-step verifier ----------------------------------------------------------------------------------------


class ArithmeticRequest(EpisodeRequest):
    problem: Annotated[str, Field(min_length=1, max_length=200)]
    answer: Annotated[str, Field(max_length=10_000)] | None = None
    """The model's answer; when absent, ``generation_url`` is asked for one."""
    generation_url: Annotated[str, Field(pattern=r"^https?://")] | None = None
    model: Annotated[str, Field(min_length=1, max_length=256)] = "sim-model"

    @model_validator(mode="after")
    def _answer_or_generator(self) -> Self:
        if self.answer is None and self.generation_url is None:
            raise ValueError("give either answer or generation_url")
        return self


class ArithmeticResponse(EpisodeResponse):
    expected: int | None = None
    answer: str | None = None
    parsed_answer: int | None = None


class ArithmeticVerifier(BaseEnvironmentServer[ArithmeticRequest, ArithmeticResponse]):
    """Score an arithmetic answer 1/0. Single step, nothing to checkpoint: its episodes are restarts."""

    protocol_name = "arithmetic-verifier"
    checkpoint_mode = "restart"
    request_model = ArithmeticRequest
    response_model = ArithmeticResponse

    def __init__(
        self, config: EnvironmentServerConfig | None = None, *, metrics: EnvironmentMetrics | None = None
    ) -> None:
        super().__init__(config, metrics=metrics)
        self._http = _DependencySession()

    def setup_webserver(self) -> web.Application:
        app = super().setup_webserver()
        app.on_cleanup.append(self._http.close)
        return app

    async def run_episode(self, request: ArithmeticRequest, episode: EpisodeContext) -> ArithmeticResponse:
        try:
            expected = problem_value(request.problem)
        except ValueError as exc:
            raise handled_episode_failure("parse_problem", str(exc), terminal=True) from None
        answer = request.answer
        if answer is None:
            answer = await episode.step("generate", lambda: self._generate(request), mode="replay")
        parsed = last_integer(answer)
        return ArithmeticResponse(
            episode_id=request.episode_id,
            reward=1.0 if parsed == expected else 0.0,
            expected=expected,
            answer=answer,
            parsed_answer=parsed,
        )

    async def _generate(self, request: ArithmeticRequest) -> str:
        assert request.generation_url is not None
        payload = {
            "model": request.model,
            "messages": [{"role": "user", "content": f"What is {request.problem}? Answer with a number."}],
            "max_tokens": 32,
        }
        url = f"{request.generation_url.rstrip('/')}/v1/chat/completions"
        try:
            async with self._http.get().post(url, json=payload) as response:
                await raise_for_dependency_status(response)
                raw = await _read_bounded(response)
            body: Any = json.loads(raw)
        except (aiohttp.ClientError, TimeoutError, OSError, ValueError) as exc:
            raise dependency_episode_failure(exc, stage="generate", name_error_type=True) from exc
        try:
            choice = body["choices"][0]
            text = choice.get("message", {}).get("content") or choice.get("text")
        except (KeyError, IndexError, TypeError, AttributeError):
            text = None
        if not isinstance(text, str):
            raise handled_episode_failure(
                "generate",
                "the generation reply carries no choices[0] text",
                terminal=True,
                evidence={"reply": safe_message(raw.decode("utf-8", errors="replace"))},
            )
        return text


async def _read_bounded(response: aiohttp.ClientResponse) -> bytes:
    """A dependency's reply, at most :data:`MAX_REPLY_BYTES`: a larger one is a ``ValueError`` (a failed dependency),
    never read into memory or echoed back."""
    if response.content_length is not None and response.content_length > MAX_REPLY_BYTES:
        raise ValueError(f"the reply is larger than {MAX_REPLY_BYTES} bytes")
    raw = bytearray()
    async for chunk in response.content.iter_chunked(16 * 1024):
        raw += chunk
        if len(raw) > MAX_REPLY_BYTES:
            raise ValueError(f"the reply is larger than {MAX_REPLY_BYTES} bytes")
    return bytes(raw)


# -- multi-step, checkpointed ------------------------------------------------------------------------------------


class MultiStepRequest(EpisodeRequest):
    values: Annotated[list[Annotated[int, Field(ge=-1_000_000, le=1_000_000)]], Field(min_length=1, max_length=64)]
    tool_url: Annotated[str, Field(pattern=r"^https?://")] | None = None
    """A remote tool server holding the sandbox (``POST /open``, ``/step``, ``/close``); local when absent."""
    policy_url: Annotated[str, Field(pattern=r"^https?://")] | None = None
    """An OpenAI-compatible policy (a shard, or ``rollout-fleet router``) asked for each step's new total, with
    the episode id as the session (``user``), the way an agent calls its model; the sum is computed locally when
    absent."""
    restart_only: bool = False
    step_delay_seconds: Annotated[float, Field(ge=0, le=60)] = 0.0
    """Simulated work per step (for demos)."""


class MultiStepResponse(EpisodeResponse):
    totals: list[int] = Field(default_factory=list)
    steps_run: list[int] = Field(default_factory=list)
    """Step indexes this attempt ran itself (a continued attempt skips the checkpointed ones)."""
    continued_from_step: int | None = None


class MultiStepEnvironment(BaseEnvironmentServer[MultiStepRequest, MultiStepResponse]):
    """A running sum, one step per value, in a sandbox released by cleanup; checkpointed after every step."""

    protocol_name = "multistep-sum"
    checkpoint_mode = "exported"
    request_model = MultiStepRequest
    response_model = MultiStepResponse

    def __init__(
        self, config: EnvironmentServerConfig | None = None, *, metrics: EnvironmentMetrics | None = None
    ) -> None:
        super().__init__(config, metrics=metrics)
        self._http = _DependencySession()
        self.local_sandboxes: set[str] = set()

    def setup_webserver(self) -> web.Application:
        app = super().setup_webserver()
        app.on_cleanup.append(self._http.close)
        return app

    async def run_episode(self, request: MultiStepRequest, episode: EpisodeContext) -> MultiStepResponse:
        if request.restart_only:
            await episode.mark_restart()
        continuation = episode.checkpoint_continuation()
        start, totals = self._resume_point(continuation)
        sandbox = await self._open_sandbox(request, episode)
        steps_run: list[int] = []
        for index in range(start, len(request.values)):
            previous = totals[-1] if totals else 0
            total = await episode.step(
                f"apply-{index}", functools.partial(self._apply, request, sandbox, index, previous), mode="wait"
            )
            totals.append(total)
            steps_run.append(index)
            await episode.record(functools.partial(self._state, request, index + 1, totals))
        correct = await episode.step("verify", lambda: self._verify(request, totals), mode="replay")
        return MultiStepResponse(
            episode_id=request.episode_id,
            reward=1.0 if correct else 0.0,
            totals=totals,
            steps_run=steps_run,
            continued_from_step=start if continuation else None,
        )

    @staticmethod
    def _resume_point(continuation: ProtocolState | None) -> tuple[int, list[int]]:
        """Where a continued attempt picks up: the next step index and the totals so far."""
        if continuation is None:
            return 0, []
        next_index, totals = continuation.data.get("next_index"), continuation.data.get("totals")
        if not isinstance(next_index, int) or not isinstance(totals, list) or len(totals) != next_index:
            raise handled_episode_failure("continue", f"unusable checkpoint state: {continuation.data}", terminal=True)
        return next_index, [int(t) for t in totals if isinstance(t, int)]

    @staticmethod
    def _state(request: MultiStepRequest, next_index: int, totals: list[int]) -> ProtocolState:
        next_step = f"apply-{next_index}" if next_index < len(request.values) else "verify"
        return ProtocolState(next_step=next_step, data={"next_index": next_index, "totals": list(totals)})

    async def _verify(self, request: MultiStepRequest, totals: list[int]) -> bool:
        running, expected = 0, []
        for value in request.values:
            running += value
            expected.append(running)
        return totals == expected

    async def _open_sandbox(self, request: MultiStepRequest, episode: EpisodeContext) -> str:
        if request.tool_url is None:
            sandbox = f"local-{uuid.uuid4().hex[:12]}"
            self.local_sandboxes.add(sandbox)
            episode.register_cleanup(lambda: self.local_sandboxes.discard(sandbox), name=f"sandbox {sandbox}")
            return sandbox
        reply = await self._tool(request, "/open", {"episode_id": request.episode_id}, stage="open_sandbox")
        sandbox = str(reply["sandbox_id"])
        episode.register_cleanup(
            lambda: self._tool(request, "/close", {"sandbox_id": sandbox}, stage="close_sandbox"),
            name=f"sandbox {sandbox}",
        )
        return sandbox

    async def _apply(self, request: MultiStepRequest, sandbox: str, index: int, previous: int) -> int:
        if request.step_delay_seconds:
            await asyncio.sleep(request.step_delay_seconds)
        value = request.values[index]
        if request.policy_url is not None:
            return await self._ask_policy(request, index, previous, value)
        if request.tool_url is None:
            return previous + value
        payload = {"sandbox_id": sandbox, "episode_id": request.episode_id, "step": index, "total": previous,
                   "value": value}  # fmt: skip
        reply = await self._tool(request, "/step", payload, stage=f"apply-{index}")
        return int(reply["total"])

    async def _ask_policy(self, request: MultiStepRequest, index: int, previous: int, value: int) -> int:
        assert request.policy_url is not None
        payload = {
            "messages": [{"role": "user", "content": f"What is {previous} + {value}?"}],
            "max_tokens": 16,
            "user": request.episode_id,
        }
        url = f"{request.policy_url.rstrip('/')}/v1/chat/completions"
        stage = f"apply-{index}"
        try:
            async with self._http.get().post(url, json=payload) as response:
                await raise_for_dependency_status(response)
                raw = await _read_bounded(response)
            text = json.loads(raw)["choices"][0]["message"]["content"]
        except (aiohttp.ClientError, TimeoutError, OSError, ValueError) as exc:
            raise dependency_episode_failure(exc, stage=stage, name_error_type=True) from exc
        except (KeyError, IndexError, TypeError) as exc:
            raise handled_episode_failure(stage, "the policy's reply carries no message", terminal=True) from exc
        total = last_integer(text) if isinstance(text, str) else None
        if total is None:
            raise handled_episode_failure(stage, "the policy's reply carries no number", terminal=True)
        return total

    async def _tool(self, request: MultiStepRequest, path: str, payload: dict[str, Any], *, stage: str) -> Any:
        assert request.tool_url is not None
        try:
            async with self._http.get().post(f"{request.tool_url.rstrip('/')}{path}", json=payload) as response:
                await raise_for_dependency_status(response)
                raw = await _read_bounded(response)
            return json.loads(raw)
        except (aiohttp.ClientError, TimeoutError, OSError, ValueError) as exc:
            raise dependency_episode_failure(exc, stage=stage, name_error_type=True) from exc


SIM_ENVIRONMENTS: dict[str, type[BaseEnvironmentServer[Any, Any]]] = {
    "verifier": ArithmeticVerifier,
    "multistep": MultiStepEnvironment,
}
"""``rollout-fleet sim-env --kind`` -> server class."""
