"""The dispatcher: keeps rollouts flowing across a changing fleet and accounts for every prompt exactly once.

The loop, per prompt: the rotation picks a routable shard (healthy set minus ejected, weighted least outstanding,
never the shard that just failed it) -> one attempt runs ``rollout(shard, prompt)`` -> on success commit; on failure
read it once (:func:`diagnose`: class, type, whether it blames the shard, whether it is terminal, reason), record it
as evidence (``blame``) and :func:`settle` it: retry (infra: after backoff, elsewhere; data: at once, elsewhere),
data-failed (reported, written to the ledger), or exhausted (skipped); whether a prompt given up on is reported,
replaced from the run's reserve or ends the run is :mod:`drops`' decision (NeMo-RL's ``max_skipped_prompts`` and
companions). Workers (``max_concurrency`` of them) pull prompts from a ready queue; prompts waiting out a backoff sit
on a timer, not on a worker.

Who does what, each in its own module:

- :class:`Dispatcher` (here): the public API and lifecycle, following the :class:`ShardSource`, and the worker loop
  that ties the parts below together: choose a shard, run the attempt, act on how it ended;
- :class:`~rollout_runtime.dispatch.run.DispatchRun` (``run``): a run's prompts and lifecycle (start, workers,
  watchdog, timers, outcomes, failing, closing); :class:`~rollout_runtime.dispatch.session.DispatchSession`, the
  same with prompts submitted over time;
- :class:`~rollout_runtime.dispatch.accounts.Accounts` (``accounts``): the one place an outcome is counted;
- :class:`~rollout_runtime.dispatch.rotation.Rotation` (``rotation``): the fleet's rotation: ejections, holds,
  trials, panic mode, pacing, evictions;
- :class:`~rollout_runtime.dispatch.attempt.Attempts` (``attempt``): one attempt: timeout, progress watchdog,
  hedging, weights check;
- :func:`~rollout_runtime.dispatch.settle.settle` (``settle``): what a failed attempt comes to, as one action.

Health: when a shard leaves the healthy set, attempts in flight on it are cancelled at once and redispatched, so a
hung shard costs the probe detection time, not the attempt timeout. Such an *eviction* is charged to neither budget:
the fleet, not the prompt, ended the attempt, and it cannot loop unboundedly because each one needs a healthy-set
transition that the probes' hysteresis rate-limits. Separately, an infra failure on a shard ejects it passively (see
``ejection``).

Ends: every prompt is handed out exactly once as :class:`Completed`, :class:`DataFailed` or :class:`Skipped`,
or is counted ``aborted`` in :class:`RunStats` when the run raises (RolloutRedispatchExhausted, RolloutStall
with ``stall_action="abort"``, a KeyboardInterrupt or SystemExit from a rollout) or is closed early. Anything else
a rollout raises, BaseExceptions and its own CancelledError included, ends that attempt in the taxonomy. Leaving the
``async for`` early closes the run: attempts in flight are cancelled and outcomes queued but not delivered count as
aborted. Every task the dispatcher starts is cancelled and awaited when its run or the dispatcher closes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable, Sequence
from types import TracebackType
from typing import Any, Literal, TypeVar

from prometheus_client import CollectorRegistry

from rollout_runtime.dispatch import blame
from rollout_runtime.dispatch.accounts import Accounts
from rollout_runtime.dispatch.attempt import INTERRUPTS, AttemptEnd, Attempts
from rollout_runtime.dispatch.clock import Clock, LoopClock
from rollout_runtime.dispatch.drops import DropCounts, DropKind
from rollout_runtime.dispatch.gate import Gate
from rollout_runtime.dispatch.ledger import FailureLedger, QuarantineEntry
from rollout_runtime.dispatch.outcomes import (
    Completed,
    DataFailed,
    DispatchEvent,
    PromptId,
    RunStats,
    ShardQuarantined,
    ShardRestored,
    Skipped,
)
from rollout_runtime.dispatch.policy import DispatchPolicy
from rollout_runtime.dispatch.quality import QualityDetector, QualitySettings, QualityVerdict, samples_of
from rollout_runtime.dispatch.rotation import Rotation
from rollout_runtime.dispatch.run import DispatchRun, PromptState, Rollout, reserve_prompt_ids
from rollout_runtime.dispatch.session import DispatchSession
from rollout_runtime.dispatch.settle import (
    Busy,
    EndRun,
    Evidence,
    GiveUpData,
    GiveUpExhausted,
    settle,
)
from rollout_runtime.failures import (
    FailureClass,
    NoHealthyShards,
    RolloutFleetMisconfigured,
    RolloutRedispatchExhausted,
    RolloutStall,
    diagnose,
)
from rollout_runtime.metrics import RolloutMetrics
from rollout_runtime.shards.model import HealthySet, ReportsCompletions, ShardSource, fleet_identity
from rollout_runtime.weights.gate import WeightsView

__all__ = ["DispatchRun", "Dispatcher", "Rollout"]

log = logging.getLogger("rollout_runtime.dispatch")

P = TypeVar("P")
R = TypeVar("R")

_PRODUCED_MEMORY = 1 << 16
"""Completed samples whose producing shard and version :meth:`Dispatcher.report_sample_quality` can still name: the
trainer reports a sample's mismatch after its step's logprob pass, so the last step or two must be remembered, and a
GRPO step is rarely above tens of thousands of samples; 65,536 pairs cost a few megabytes."""


class Dispatcher:
    """Runs prompts across the healthy shards of a :class:`ShardSource` under a :class:`DispatchPolicy`.

    ::

        async with Dispatcher(source, policy) as dispatcher:
            async for outcome in dispatcher.run(prompts, rollout):
                ...

    ``metrics`` (or a ``registry`` to create them on; default a private one) receives the ``rollout_*``
    metrics, labelled with the source's ``fleet`` and ``namespace`` (:func:`~rollout_runtime.shards.fleet_identity`)
    unless the caller passes its own; ``observer`` is called synchronously with every :data:`DispatchEvent` (keep
    it cheap); ``seed`` makes backoff jitter reproducible; ``clock`` replaces the loop clock in tests.
    """

    def __init__(
        self,
        source: ShardSource,
        policy: DispatchPolicy | None = None,
        *,
        metrics: RolloutMetrics | None = None,
        registry: CollectorRegistry | None = None,
        observer: Callable[[DispatchEvent], None] | None = None,
        clock: Clock | None = None,
        seed: int | None = None,
        ledger: FailureLedger | None = None,
        weights: WeightsView | None = None,
    ) -> None:
        self.policy = policy if policy is not None else DispatchPolicy()
        if metrics is None:
            fleet, namespace = fleet_identity(source)
            metrics = RolloutMetrics(registry, fleet=fleet, namespace=namespace)
        self.metrics = metrics
        self._source = source
        self._completions = source if isinstance(source, ReportsCompletions) else None  # passive liveness
        self._weights = weights if weights is not None else _weights_of(source)  # stale gating (see weights/)
        if self._weights is not None:
            self.metrics.stale_shards = self._weights.stale_shards
        self._observer = observer
        self._clock: Clock | None = clock
        self._rng = random.Random(seed)
        self._ledger = ledger
        if ledger is None and self.policy.failure_ledger_path is not None:
            self._ledger = FailureLedger(self.policy.failure_ledger_path)
        self._evidence = blame.Evidence()
        rate = self.policy.quality_false_positive_rate
        self._quality = QualityDetector(QualitySettings(false_positive_rate=rate)) if rate > 0 else None
        self._produced: OrderedDict[PromptId, tuple[str, int | None]] = OrderedDict()
        self._recent: dict[str, deque[PromptId]] = {}
        """Each shard's recent prompts (a quality window's worth), named by its ShardQuarantined event."""
        self._suspect: dict[str, str] = {}
        """Quarantined shards, until restored, and the signal that took them out: their results are flagged."""
        self._rotation = Rotation(self.policy, self.metrics, self._emit)
        self._attempts = Attempts(self.policy, self._rotation, self._weights)
        self.drops = DropCounts()
        """Prompts given up on over every run (``max_skipped_prompts``, ``max_consecutive_dropped_prompts``)."""
        self._runs: set[DispatchRun[Any, Any]] = set()
        self._follower: asyncio.Task[None] | None = None
        self._entered = False
        self._stop_counting: Callable[[], None] | None = None

    # -- lifecycle -----------------------------------------------------------------------------------------

    async def __aenter__(self) -> Dispatcher:
        if self._entered:
            raise RuntimeError("a Dispatcher can be entered once")
        self._entered = True
        loop = asyncio.get_running_loop()
        if self._clock is None:
            self._clock = LoopClock(loop)
        self._rotation.start(loop, self._clock)
        self._attempts.start(loop, self._clock)
        self._follower = asyncio.create_task(self._follow(), name="rollout-dispatch-follow-shards")
        self._stop_counting = self.metrics.count_in_flight(lambda: self.in_flight)
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Stop every run, the shard-source follower and timers; close the ledger."""
        for run in list(self._runs):
            await run.aclose()
        self._rotation.close()
        if self._follower is not None:
            self._follower.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._follower
            self._follower = None
        if self._ledger is not None:
            self._ledger.close()
        if self._stop_counting is not None:
            self._stop_counting()
            self._stop_counting = None

    # -- public view ----------------------------------------------------------------------------------------

    @property
    def snapshot(self) -> HealthySet | None:
        """The healthy set in force (None until the source yields one)."""
        return self._rotation.snapshot

    @property
    def routable(self) -> tuple[str, ...]:
        """Shards in rotation: healthy minus ejected (all healthy in panic mode). A held shard, or one on trial with its
        one attempt out, is among them but takes no new attempt until that ends (see ``ejection``)."""
        return self._rotation.routable

    @property
    def ejected(self) -> frozenset[str]:
        return self._rotation.ejected

    @property
    def in_flight(self) -> int:
        """Attempts running now, over every run (each run's ``stats.in_flight`` is the count; this is its sum)."""
        return sum(run.stats.in_flight for run in tuple(self._runs))

    @property
    def gate(self) -> Gate:
        """Each shard's room learned from its busy answers, and the attempts waiting for it (``dispatch/gate``)."""
        return self._attempts.gate

    def outstanding(self) -> dict[str, int]:
        """Attempts in flight per healthy shard."""
        return self._rotation.outstanding()

    def weights_version(self, shard: str) -> int | None:
        """The weights version ``shard`` is known to serve (None: weights not tracked, or unknown)."""
        return self._attempts.version_of(shard)

    def report_sample_quality(self, prompt_id: PromptId, mismatch: float) -> bool:
        """The trainer's verdict on a completed sample: ``mismatch`` (higher is worse: its recomputed-vs-rollout
        logprob error, or a negated reward) is attributed to the shard and weights version that produced it and
        compared with that version's other shards (``dispatch/quality``); a clear outlier is quarantined.

        Report each sample once, before its prompt id is reused by a later run. Return whether the prompt was known
        (False: not completed by this dispatcher, forgotten, or quarantine is off)."""
        produced = self._produced.get(prompt_id)
        if produced is None or self._quality is None:
            return False
        shard, version = produced
        if shard not in self._suspect and (verdict := self._quality.report(shard, version, mismatch)) is not None:
            self._quarantine(verdict)
        return True

    def run(
        self,
        prompts: Iterable[P],
        rollout: Rollout[P, R],
        *,
        prompt_ids: Sequence[PromptId] | None = None,
        reserve: Iterable[P] = (),
        reserve_ids: Sequence[PromptId] | None = None,
        drop_rules: bool = True,
    ) -> DispatchRun[P, R]:
        """Start dispatching ``prompts`` (ids: their positions, or ``prompt_ids``) when first iterated.

        ``drop_rules=False``: the prompts are independent requests, not a training step (the router's requests, an
        environment pool's episodes): a prompt given up on is only reported, and NeMo-RL's drop allowances
        (``max_skipped_prompts``, ``max_consecutive_dropped_prompts``, ``min_step_batch_fraction``) neither count
        it nor end the run for it.

        ``reserve``: spare prompts for ``on_dropped_prompt="replace"`` (at least ``replacement_reserve_prompts``):
        a prompt given up on is reported as usual and the next reserve prompt takes its batch position, so the run
        still yields up to ``len(prompts)`` completions. A reserve prompt is submitted (and accounted for) only when
        drawn; their ids continue the positions (``len(prompts)``, ...) or are ``reserve_ids``.
        """
        if not self._entered or self._follower is None:
            raise RuntimeError("use the Dispatcher as `async with Dispatcher(...) as dispatcher:` before run()")
        items, spares = list(prompts), list(reserve)
        ids: Sequence[PromptId] = range(len(items)) if prompt_ids is None else prompt_ids
        if len(ids) != len(items):
            raise ValueError(f"got {len(ids)} prompt_ids for {len(items)} prompts")
        spare_ids = reserve_prompt_ids(self.policy, len(items), spares, prompt_ids, reserve_ids)
        if len(set(ids) | set(spare_ids)) != len(ids) + len(spare_ids):
            raise ValueError("prompt_ids and reserve_ids must be unique: each prompt is accounted for exactly once")
        states = [
            PromptState(prompt_id=i, prompt=p, position=n) for n, (i, p) in enumerate(zip(ids, items, strict=True))
        ]
        run: DispatchRun[P, R] = DispatchRun(
            self, self._accounts(), states, rollout, zip(spare_ids, spares, strict=True)
        )
        run.drop_rules = drop_rules
        self._runs.add(run)
        return run

    def session(
        self,
        rollout: Rollout[P, R],
        *,
        drop_rules: bool = True,
        on_prompt_error: Literal["end_session", "fail_prompt"] = "end_session",
    ) -> DispatchSession[P, R]:
        """A long-lived online session: ``submit(prompt)`` one at a time, sharing budgets, the stall watchdog,
        ejection state and stats (see :mod:`rollout_runtime.dispatch.session`). Close it (``async with``) when done.
        ``drop_rules=False``: the submissions are independent requests (an OpenAI-shaped client's calls, a verl
        server's requests): a prompt given up on is that call's answer, never the end of the session (see
        :meth:`run`). ``on_prompt_error="fail_prompt"``: a run-terminal error found on one submission's attempt (no
        routable shard for a whole healthy wait, a misconfigured-fleet verdict) is raised by that submission's
        future alone and the session goes on (a router answers each request on its own)."""
        if not self._entered or self._follower is None:
            raise RuntimeError("use the Dispatcher as `async with Dispatcher(...) as dispatcher:` before session()")
        session: DispatchSession[P, R] = DispatchSession(
            self, self._accounts(), rollout, on_prompt_error=on_prompt_error
        )
        session.drop_rules = drop_rules
        self._runs.add(session)
        return session

    async def wait_ready(self, min_shards: int = 1, timeout: float | None = None) -> tuple[str, ...]:  # noqa: ASYNC109
        """Wait until at least ``min_shards`` shards are routable; return their names.

        Raises :class:`NoHealthyShards` after ``timeout`` seconds (None: wait forever), naming the shards the
        source knows and why they are not ready when the source can say (:meth:`not_ready_reasons`).
        """
        if min_shards < 1:
            raise ValueError(f"min_shards must be >= 1, got {min_shards}")
        try:
            async with asyncio.timeout(timeout):
                await self._rotation.wait_routable(min_shards)
        except TimeoutError:
            raise NoHealthyShards(self._not_ready_message(min_shards, timeout)) from None
        return self.routable

    def not_ready_reasons(self) -> dict[str, str]:
        """Shard name -> why it is not in the healthy set, from a source that knows (``not_ready_reasons()``)."""
        reasons = getattr(self._source, "not_ready_reasons", None)
        if reasons is None:
            return {}
        try:
            return dict(reasons())
        except Exception:
            log.exception("shard source failed to say why shards are not ready")
            return {}

    def _not_ready_message(self, min_shards: int, timeout: float | None) -> str:
        routable = len(self._rotation.routable)
        waited = "" if timeout is None else f", after {timeout:g}s"
        message = f"{routable} routable shard(s), {min_shards} needed{waited}"
        reasons = self.not_ready_reasons()
        if reasons:
            message += "; not ready: " + "; ".join(f"{name}: {why}" for name, why in sorted(reasons.items())[:10])
        return message

    # -- the attempt loop -----------------------------------------------------------------------------------

    @property
    def clock(self) -> Clock:
        assert self._clock is not None, "the dispatcher has not been entered"
        return self._clock

    def _accounts(self) -> Accounts:
        """A new run's accounts (its stats start empty)."""
        observer = self._emit if self._observer is not None else None
        return Accounts(RunStats(), self.metrics, self.clock, observer, self._ledger)

    async def work(self, run: DispatchRun[Any, Any]) -> None:
        """A worker of ``run``: attempt its ready prompts one at a time while it is active."""
        ready = run.ready
        try:
            while run.active:
                state = await ready.get()
                if state is None or not run.active:
                    return
                await self._attempt(run, state)
        except asyncio.CancelledError:
            raise
        except (RolloutRedispatchExhausted, RolloutStall) as exc:  # raised by the rollout itself: run-terminal
            run.fail(exc)
        except INTERRUPTS as exc:  # Ctrl-C or sys.exit() inside a rollout: every prompt is accounted, then it ends
            run.fail(exc)
        except BaseException as exc:  # a bug in an observer, the ledger's disk...: the run ends loudly
            log.exception("dispatcher worker failed")
            run.fail(exc)

    def forget(self, prompt_id: PromptId) -> None:
        """The prompt left a run without an outcome: a later run may reuse its id, and starts with no evidence."""
        self._evidence.forget(prompt_id)

    def closed(self, run: DispatchRun[Any, Any]) -> None:
        """``run`` stopped: it no longer counts towards :attr:`in_flight`, nor is closed with the dispatcher."""
        self._runs.discard(run)

    async def _attempt(self, run: DispatchRun[Any, Any], state: PromptState) -> None:
        rotation = self._rotation
        slot = rotation.pick(state.prompt, state.last_failed, state.tried)
        if rotation.waits(slot):
            slot = await rotation.choose(state.prompt, state.last_failed, state.tried, lambda: run.active, slot)
            if not run.active:
                return
        if slot is None:
            self._no_shard(run, state)
            return
        run.grow()
        end = await self._attempts.run(run.rollout, slot, state, run.accounts)
        if not run.active:
            return
        if not end.sent:  # evicted while it waited for room: it never reached the shard, so it is not an attempt
            run.unsent(state)
        elif end.evicted:
            run.accounts.attempt_ended("cancelled", state.prompt_id, slot.name, end.seconds)
            state.budget.evictions += 1
            state.last_failed = slot.name
            self._retry(run, state, 0.0)
        elif end.failure is not None:
            self._failed(run, state, end)
        else:
            self._answered(run, state, end)

    def _answered(self, run: DispatchRun[Any, Any], state: PromptState, end: AttemptEnd) -> None:
        """An answer: committed when its weights allow, otherwise redispatched elsewhere with no budget charged."""
        verdict, shard = end.verdict, end.answered_by.name
        assert verdict is not None
        if not verdict.committable:
            log.info("prompt %s: answer from shard %s not committed: %s", state.prompt_id, shard, verdict.reason)
            state.stale_versions[verdict.version] = state.stale_versions.get(verdict.version, 0) + 1
            run.accounts.attempt_ended("stale", state.prompt_id, shard, end.seconds)
            state.budget.evictions += 1
            state.last_failed = shard
            self._retry(run, state, 0.0)
            return
        if end.watch is not None:
            self._attempts.committed(end)
        run.accounts.attempt_ended("success", state.prompt_id, shard, end.seconds)
        self._evidence.succeeded(shard, state.prompt_id)
        self._rotation.served(end.answered_by, started=end.started)
        if self._completions is not None:
            self._completions.attempt_succeeded(shard)
        run.accounts.committed(verdict)
        self.drops.committed()
        attempts = state.budget.attempts + 1
        quality = self._sampled(shard, verdict.version, state.prompt_id, end.result)
        completed = Completed(state.prompt_id, state.prompt, end.result, attempts, shard, verdict.version, quality)
        run.finish(state, completed)

    def _sampled(self, shard: str, version: int | None, prompt_id: PromptId, result: object) -> str | None:
        """Feed a committed result to the quality detector; return the signal its shard is quarantined on, if it is
        (the result came from the suspect window: the trainer is told rather than left to commit it silently)."""
        if self._quality is None:
            return None
        self._produced[prompt_id] = (shard, version)
        self._produced.move_to_end(prompt_id)
        if len(self._produced) > _PRODUCED_MEMORY:
            self._produced.popitem(last=False)
        recent = self._recent.get(shard)
        if recent is None:
            recent = self._recent[shard] = deque(maxlen=self._quality.settings.window)
        recent.append(prompt_id)
        if shard not in self._suspect:  # a quarantined shard's late answers must not seed its next window
            for sample in samples_of(result):
                if (verdict := self._quality.observe(shard, version, sample)) is not None:
                    self._quarantine(verdict)
                    break
        return self._suspect.get(shard)

    def _quarantine(self, verdict: QualityVerdict) -> None:
        """Take an outlier shard out of rotation like a sick one (ejected, back through its probe and a trial), and
        say why: the event, the metric and the ledger carry the evidence."""
        shard = verdict.shard
        ejection = self._rotation.eject(shard, None)
        if ejection is None:  # the panic rule kept it in rotation (held instead), or it left the healthy set
            log.warning("shard %s: outputs unlike its peers' (%s) but the ejection cap keeps it in", shard, verdict)
            return
        assert self._quality is not None
        self._quality.forget(shard)
        self._suspect[shard] = verdict.signal
        prompt_ids = tuple(self._recent.pop(shard, ()))
        self.metrics.quarantine(shard, verdict.signal)
        log.warning(
            "shard %s quarantined for %.0fs: %s %s test p=%.3g < %.3g, effect %.3g, evidence %s",
            shard,
            ejection.seconds,
            verdict.signal,
            verdict.test,
            verdict.p_value,
            verdict.threshold,
            verdict.effect,
            dict(verdict.evidence),
        )
        self._emit(
            ShardQuarantined(
                shard=shard,
                version=verdict.version,
                signal=verdict.signal,
                test=verdict.test,
                p_value=verdict.p_value,
                threshold=verdict.threshold,
                effect=verdict.effect,
                evidence=verdict.evidence,
                peers=verdict.peers,
                seconds=ejection.seconds,
                count=ejection.count,
                prompt_ids=prompt_ids,
            )
        )
        if self._ledger is not None:
            self._ledger.write(
                QuarantineEntry(
                    shard,
                    verdict.signal,
                    verdict.test,
                    verdict.version,
                    verdict.p_value,
                    verdict.threshold,
                    verdict.effect,
                    dict(verdict.evidence),
                    verdict.peers,
                    prompt_ids,
                    self.clock.wall(),
                )
            )

    def _retry(self, run: DispatchRun[Any, Any], state: PromptState, delay: float) -> None:
        """Send the prompt back for another attempt after ``delay`` seconds. A prompt whose ``retry_refused``
        attribute is set (a reason) is not tried again: it is skipped with that reason, under the drop rules. The
        router's streamed requests say so once their first byte reached the client."""
        refused = getattr(state.prompt, "retry_refused", None)
        if refused is None:
            run.requeue(state, delay)
            return
        self._drop(run, state, "infra", "RetryRefused", str(refused), None)

    def _failed(self, run: DispatchRun[Any, Any], state: PromptState, end: AttemptEnd) -> None:
        """Record the failure as evidence, settle it, and act on the settlement."""
        slot, exc, diagnosis = end.slot, end.failure, end.diagnosis
        assert exc is not None, "a failed attempt carries its failure"
        assert diagnosis is not None, "a failed attempt carries its diagnosis (made once, in attempt.py)"
        sig = blame.signature(diagnosis, slot.name, slot.shard.endpoint)
        evidence = Evidence(blame.Verdict(blame.Blame.FIRST_VERDICT))
        if sig is not None:
            healthy, in_flight = self._rotation.slots, self._rotation.in_flight()
            verdict = blame.judge(
                self._evidence,
                prompt=state.prompt_id,
                shard=slot.name,
                sig=sig,
                diagnosis=diagnosis,
                healthy=healthy,
                in_flight=in_flight,
            )
            evidence = Evidence.read(
                self._evidence, verdict, state.prompt_id, sig, (*state.data_charges, (slot.name, sig))
            )
        settled = settle(
            self.policy,
            diagnosis,
            sig,
            evidence,
            state.budget,
            tuple(state.data_charges),
            shard=slot.name,
            tried=state.tried,
            immediate=end.stalled,
            draw=self._rng.random,
        )
        state.budget, state.data_charges = settled.budget, list(settled.data_charges)
        state.last_failed = slot.name
        run.accounts.attempt_ended(settled.outcome, state.prompt_id, slot.name, end.seconds, diagnosis)
        action = settled.action
        if isinstance(action, EndRun):
            error = RolloutFleetMisconfigured(action.evidence)
            error.__cause__ = exc
            log.error("%s", error)
            run.fail_prompt(state, error)
            return
        if isinstance(action, Busy):
            self._rotation.busy(slot)
            self._retry(run, state, 0.0)  # sent when a shard has room: the gate holds it, not a Retry-After timer
            return
        if settled.eject and (ejection := self._rotation.eject(slot.name, end.seconds)) is not None:
            run.accounts.ejected(slot.name, ejection)
        if isinstance(action, GiveUpData):
            self._drop(run, state, "data", diagnosis.failure_type, action.reason or diagnosis.reason, exc)
        elif isinstance(action, GiveUpExhausted):
            run.accounts.exhausted()
            self._drop(run, state, "infra", diagnosis.failure_type, diagnosis.reason, exc)
        else:
            at_once = action.at_once_elsewhere and self._rotation.elsewhere(slot)
            self._retry(run, state, 0.0 if at_once else action.delay_seconds)

    def _no_shard(self, run: DispatchRun[Any, Any], state: PromptState) -> None:
        """No routable shard for a whole healthy wait: the run ends now, whatever the budgets, instead of charging
        every prompt its infra budget against an empty fleet (memory and time that grow with the prompt count)."""
        waited = self.policy.healthy_wait_seconds
        why = self._not_ready_message(1, waited)
        cause = NoHealthyShards(f"no routable shard within {waited:g}s: {why}")
        run.accounts.attempt_ended("infra_failure", state.prompt_id, None, None, diagnose(cause))
        error = RolloutRedispatchExhausted(
            f"no routable shard for {waited:g}s (healthy_wait_seconds): the fleet has no healthy shard to run on: {why}"
        )
        error.__cause__ = cause
        log.error("%s", error)
        run.fail_prompt(state, error)

    def _drop(
        self,
        run: DispatchRun[Any, Any],
        state: PromptState,
        kind: DropKind,
        failure_type: str,
        reason: str,
        exc: BaseException | None,
    ) -> None:
        """Give the prompt up: data-failed (``kind="data"``) or skipped, under the run's drop rules."""
        attempts, shards = state.budget.attempts, tuple(state.tried)
        self._evidence.forget(state.prompt_id)
        outcome: DataFailed[Any] | Skipped[Any]
        if kind == "data":
            outcome = DataFailed(
                state.prompt_id, state.prompt, FailureClass.DATA, failure_type, reason, attempts, shards
            )
        else:
            outcome = Skipped(state.prompt_id, state.prompt, failure_type, reason, attempts, shards)
        run.give_up(state, self.drops, kind, outcome, exc)

    # -- the shard source ----------------------------------------------------------------------------------------

    async def _follow(self) -> None:
        iterator = self._source.snapshots()
        try:
            async for snapshot in iterator:
                for name in self._rotation.apply(snapshot):
                    self._attempts.gate.forget(name)
                    self._suspect.pop(name, None)  # it left: it comes back as a new process, judged afresh
                    self._recent.pop(name, None)
                    if self._quality is not None:
                        self._quality.forget(name)
        except Exception:
            log.exception("shard source failed; its last healthy set stays in force")
        finally:
            aclose = getattr(iterator, "aclose", None)
            if aclose is not None:
                await aclose()

    def _emit(self, event: DispatchEvent) -> None:
        if isinstance(event, ShardRestored):
            self._suspect.pop(event.shard, None)  # back on trial: judged on new samples only
        if self._observer is None:
            return
        try:
            self._observer(event)
        except Exception:
            log.exception("dispatch observer failed on %r", event)


def _weights_of(source: object) -> WeightsView | None:
    """The source's weights view (``source.weights``, as LocalShardSource has), if it offers one."""
    weights = getattr(source, "weights", None)
    return weights if isinstance(weights, WeightsView) else None
