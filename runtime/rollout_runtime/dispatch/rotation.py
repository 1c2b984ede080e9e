"""The fleet's rotation: which shards take attempts now, as one object with its state.

The healthy set comes from the shard source (:meth:`Rotation.apply`); passive ejection takes a failing shard out of
it for a while, or holds it for a backoff when the panic rule keeps it in (see ``ejection``); a restored shard is on
trial, taking a bounded number of attempts until one is served; when every healthy shard is ejected, all of them are
routed to anyway (panic mode, every one on trial). Pacing spreads a wave of new attempts over turns of the event loop.

Of the healthy shards, the *routable* are in rotation (not ejected, or all of them in panic mode) and the *pickable*
may take an attempt now (routable, not held, and not on trial with its room used). A shard that leaves the healthy
set has its attempts in flight cancelled at once (*evicted*): a hung shard costs the probe detection time, not the
attempt timeout. The rotation emits :class:`HealthyShardsChanged` and :class:`ShardRestored`; ejections are the
caller's to account (they belong to the run whose attempt failed).
"""

from __future__ import annotations

import asyncio
import collections
import logging
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from rollout_runtime.dispatch.affinity import affinity_key, pick_affine
from rollout_runtime.dispatch.budget import backoff_seconds
from rollout_runtime.dispatch.clock import Clock
from rollout_runtime.dispatch.ejection import Ejection, EjectionTracker
from rollout_runtime.dispatch.outcomes import DispatchEvent, HealthyShardsChanged, ShardRestored
from rollout_runtime.dispatch.policy import DispatchPolicy
from rollout_runtime.dispatch.selection import ShardLoad, pick_shard
from rollout_runtime.dispatch.share import Shares
from rollout_runtime.metrics import RolloutMetrics
from rollout_runtime.shards.model import HealthySet

__all__ = ["TURN_BUDGET", "Lease", "Rotation", "Slot"]

log = logging.getLogger("rollout_runtime.dispatch")

TURN_BUDGET: Final[int] = 2
"""New attempts a shard takes per turn of the event loop while another shard is pickable (see :meth:`Rotation.choose`).

A turn is the unit in which the loop reads the network: the first answer of a shard that has just begun failing can
only steer attempts started in a later turn, so each attempt a shard takes in a turn beyond the first is sent to it
blind, and the budget bounds those at ``TURN_BUDGET - 1`` per turn. With one, a shard whose answers are read together
gets the replacements for them one turn apart, each waiting while the shard has room; two lets it take the
replacement for an answer just read and one more in the same turn, at the cost of one blind attempt."""


@dataclass(slots=True, eq=False)
class Lease:
    """One attempt running on a shard, as the rotation sees it: cancelled if its shard leaves the healthy set."""

    task: asyncio.Future[Any]
    evicted: bool = False
    """Its shard left the healthy set and the rotation cancelled it."""
    trial: bool = False
    """Started while its shard was on trial: it counts against the trial's room (see ``ejection``)."""


@dataclass(slots=True, eq=False)
class Slot(ShardLoad):
    """One healthy shard and its attempts in flight."""

    leases: set[Lease] = field(default_factory=set)
    turn_attempts: int = 0
    """Attempts started on it in this turn of the event loop (see :meth:`Rotation.choose`)."""
    trial_started: float = 0.0
    """Monotonic start of the first of its attempts in flight while on trial (see ``ejection``)."""
    trial_attempts: int = 0
    """Its attempts in flight that started on trial. The room counts these only: an attempt from before the ejection
    says nothing about the shard now, and one running for minutes must not keep the trial from starting."""

    @property
    def paced(self) -> bool:
        """It took its :data:`TURN_BUDGET` new attempts this turn: the next waits a turn while another shard is
        pickable."""
        return self.turn_attempts >= TURN_BUDGET


class Rotation:
    """The healthy shards, their ejections, holds and trials, panic mode and pacing; see the module docstring.

    Created with the dispatcher; :meth:`start` binds it to the running loop and clock, :meth:`close` cancels its
    timer. ``emit`` receives its events.
    """

    def __init__(self, policy: DispatchPolicy, metrics: RolloutMetrics, emit: Callable[[DispatchEvent], None]) -> None:
        self._policy = policy
        self._metrics = metrics
        self._emit = emit
        self._ejections = EjectionTracker(
            policy.ejection_base_seconds,
            policy.ejection_max_seconds,
            policy.max_ejection_percent,
            probe_grace=self._backoff,
        )
        self._shares = Shares()
        self._slots: dict[str, Slot] = {}
        self._routable: list[Slot] = []
        self._pickable: list[Slot] = []
        """The routable shards an attempt may start on now: not held, and not on trial with its one attempt out."""
        self._panic = False
        self._fresh: list[Slot] = []
        """Shards with attempts started in this turn of the event loop."""
        self._turn_waiters: collections.deque[asyncio.Future[None]] = collections.deque()
        """Attempts paced to a later turn (see :meth:`choose`)."""
        self._aging = False
        """A :meth:`new_turn` is scheduled for the next turn."""
        self._cursor = 0
        self._snapshot: HealthySet | None = None
        self._changed = asyncio.Event()
        self._expiry_timer: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._clock: Clock | None = None

    def start(self, loop: asyncio.AbstractEventLoop, clock: Clock) -> None:
        self._loop, self._clock = loop, clock

    def close(self) -> None:
        if self._expiry_timer is not None:
            self._expiry_timer.cancel()
            self._expiry_timer = None

    # -- what it holds ------------------------------------------------------------------------------------------

    @property
    def snapshot(self) -> HealthySet | None:
        return self._snapshot

    @property
    def slots(self) -> Mapping[str, Slot]:
        """The healthy shards, by name (ejected ones included)."""
        return self._slots

    @property
    def routable(self) -> tuple[str, ...]:
        return tuple(slot.name for slot in self._routable)

    @property
    def ejected(self) -> frozenset[str]:
        return self._ejections.ejected

    @property
    def panic(self) -> bool:
        """Every healthy shard is ejected: all of them are routed to anyway, each on trial."""
        return self._panic

    def outstanding(self) -> dict[str, int]:
        return {name: slot.outstanding for name, slot in self._slots.items()}

    def in_flight(self) -> int:
        """Attempts running on healthy shards."""
        return sum(slot.outstanding for slot in self._slots.values())

    def elsewhere(self, slot: Slot) -> bool:
        """Whether an attempt could start now on a shard other than ``slot``."""
        return any(other is not slot for other in self._pickable)

    async def wait_routable(self, min_shards: int) -> None:
        while len(self._routable) < min_shards:
            await self._changed.wait()

    # -- picking a shard ------------------------------------------------------------------------------------------

    def pick(
        self, prompt: object, last_failed: str | None, tried: Sequence[str], *, fallback: bool = False
    ) -> Slot | None:
        """The shard for a prompt's next attempt; None if none can take one now. In panic mode every shard is on
        trial, and a retry waits for room on another one instead of going back to the shard that just failed it
        (which answers fastest, so has room first); ``fallback`` lifts that once the healthy wait is over."""
        routable = self._pickable
        if self._panic and not fallback and last_failed is not None and len(self._routable) > 1:
            routable = [slot for slot in routable if slot.name != last_failed]
        if not routable:
            return None
        self._cursor += 1
        if (key := affinity_key(prompt)) is not None:  # a session stays on its shard while it is routable
            return pick_affine(routable, key, last_failed=last_failed, tried=tried)
        return pick_shard(routable, start=self._cursor, last_failed=last_failed, tried=tried)

    def pick_hedge(self, slot: Slot, tried: Sequence[str]) -> Slot | None:
        """Another pickable shard for a hedge of an attempt running on ``slot``; None when there is none."""
        self._cursor += 1
        other = pick_shard(self._pickable, start=self._cursor, last_failed=slot.name, tried=tried)
        return None if other is slot else other

    def waits(self, slot: Slot | None) -> bool:
        """Whether an attempt whose :meth:`pick` was ``slot`` must wait (:meth:`choose`) instead of starting now."""
        return slot is None or ((slot.paced or bool(self._turn_waiters)) and len(self._pickable) > 1)

    async def choose(
        self,
        prompt: object,
        last_failed: str | None,
        tried: Sequence[str],
        wanted: Callable[[], bool],
        picked: Slot | None,
    ) -> Slot | None:
        """The shard for the next attempt when its :meth:`pick` (``picked``) :meth:`waits`: after pacing and, when
        none is pickable, the healthy wait; None when no shard became pickable within ``healthy_wait_seconds`` or
        ``wanted()`` turned false while waiting.

        Pacing: while another shard is pickable, a shard takes at most :data:`TURN_BUDGET` new attempts per turn of
        the event loop. Attempts sent together come back together, and least-outstanding replaces each on the shard
        it left; when that shard has just begun answering 503, the whole batch would be sent to it before the loop
        reads the first answer. Waiting a turn lets the loop read the network in between.
        """
        slot = picked
        if slot is not None and (slot.paced or self._turn_waiters) and len(self._pickable) > 1:
            behind = True  # a newcomer queues behind the attempts already waiting for a turn: first come, first served
            while True:
                await self._next_turn(behind)
                if not wanted():
                    return None
                slot = self.pick(prompt, last_failed, tried)
                if slot is None or not slot.paced or len(self._pickable) <= 1:
                    break
                behind = False  # woken in its turn and paced again: first in line for the next one
        if slot is not None:
            return slot
        # One absolute deadline on the loop's clock. Recomputing "deadline - now" each turn can leave a remainder
        # below the clock's resolution (1e-15 s) that is due at once forever: a spin that never lets time move.
        try:
            async with asyncio.timeout(self._policy.healthy_wait_seconds):
                while (slot := self.pick(prompt, last_failed, tried)) is None:
                    await self._changed.wait()
        except TimeoutError:
            return self.pick(prompt, last_failed, tried, fallback=True)
        return slot

    async def _next_turn(self, behind: bool) -> None:
        waiter = self._running_loop().create_future()
        if behind:
            self._turn_waiters.append(waiter)
        else:
            self._turn_waiters.appendleft(waiter)
        self._new_turn_soon()
        await waiter

    def _new_turn_soon(self) -> None:
        if not self._aging:
            self._aging = True
            self._running_loop().call_soon(self.new_turn)

    def new_turn(self) -> None:
        """A new turn of the event loop: no shard's attempts are from this turn any more. Wake as many paced attempts
        as the shards can start this turn (not every waiter, which would cost a wake-up per waiter per attempt); the
        rest wait for the next turn."""
        self._aging = False
        for slot in self._fresh:
            slot.turn_attempts = 0
        self._fresh.clear()
        waiters = self._turn_waiters
        wake = len(self._pickable) * TURN_BUDGET or len(waiters)  # nothing pickable: all go on to wait for one
        while waiters and wake:
            waiter = waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                wake -= 1
        if waiters:
            self._new_turn_soon()

    # -- attempts on a shard --------------------------------------------------------------------------------------

    def occupy(self, slot: Slot, lease: Lease) -> None:
        """An attempt starts on ``slot``. A shard on trial after an ejection takes a bounded number at a time (see
        ``ejection``): the pickable set is refreshed when its room is used and again when the room grows."""
        slot.outstanding += 1
        slot.leases.add(lease)
        slot.turn_attempts += 1
        if slot.turn_attempts == 1:
            self._fresh.append(slot)
            self._new_turn_soon()
        if self._on_trial(slot.name):
            lease.trial = True
            slot.trial_attempts += 1
            now = self._now()
            if slot.trial_attempts == 1:
                slot.trial_started = now
            self._refresh_pickable()
            _, due = self._ejections.trial_room(slot.name, since=slot.trial_started, now=now)
            if due is not None:  # the loop may run a timer a clock resolution early: refresh as of its due time
                self._running_loop().call_later(due - now, self._refresh_pickable, due)

    def release(self, slot: Slot, lease: Lease) -> None:
        slot.outstanding -= 1
        slot.leases.discard(lease)
        if lease.trial:
            slot.trial_attempts -= 1
        if not slot.outstanding:
            slot.turn_attempts = 0  # nothing in flight: no answer left unread there to wait for
        if lease.trial and not slot.trial_attempts and slot.name in self._slots:
            self._refresh_pickable()

    def served(self, slot: Slot, started: float) -> None:
        """An attempt started at ``started`` succeeded on ``slot``: a shard on trial passes it (in panic mode, an
        ejected shard that serves is back in rotation, which ends panic mode), and its share grows back."""
        name, ejections = slot.name, self._ejections
        if self._panic and ejections.restore_served(name, started=started, now=self._now()):
            self._emit(ShardRestored(name, "served"))
            self._recompute()
        was_on_trial = ejections.on_trial(name)
        ejections.served(name, started=started)
        if was_on_trial and not ejections.on_trial(name):
            self._refresh_pickable()  # its room no longer applies
        slot.weight = slot.shard.weight * self._shares.served(name)

    def busy(self, slot: Slot) -> None:
        """``slot`` answered that it is busy: lower its share. The prompt goes back at once: the shard's room
        (``gate``) holds it until a shard it is sent to has room, so nothing here waits out a Retry-After."""
        slot.weight = slot.shard.weight * self._shares.busy(slot.name)

    # -- health: the source's healthy set, ejection, holds --------------------------------------------------------

    def apply(self, snapshot: HealthySet) -> list[str]:
        """A new healthy set: shards that left it have their attempts cancelled (evicted). Returns their names."""
        fresh = {shard.name: shard for shard in snapshot.shards}
        gone: list[Slot] = []
        for name, slot in list(self._slots.items()):
            shard = fresh.get(name)
            if shard is None or shard.endpoint != slot.shard.endpoint:
                gone.append(slot)
                del self._slots[name]
            elif shard != slot.shard:
                slot.shard, slot.weight = shard, shard.weight * self._shares.of(name)
        for name in sorted(fresh):
            if name not in self._slots:
                self._slots[name] = Slot(fresh[name])
                self._metrics.shard_joined(name)
        self._slots = dict(sorted(self._slots.items()))
        self._snapshot = snapshot
        for name in self._ejections.probes_succeeded(snapshot.probe_ok_at, self._now()):
            self._emit(ShardRestored(name, "probe"))
        self._recompute(revision=snapshot.revision)
        self._schedule_expiry()
        for slot in gone:
            for lease in list(slot.leases):
                if not lease.evicted:
                    lease.evicted = True
                    lease.task.cancel(msg=f"shard {slot.name} left the healthy set")
        return [slot.name for slot in gone]

    def eject(self, name: str, took: float | None) -> Ejection | None:
        """An attempt that took ``took`` seconds failed on ``name`` and blames it: eject it, or, when the panic rule
        keeps it in rotation, hold it for the backoff. The ejection, if there was one, for the caller to account."""
        clock, took = self._bound_clock(), math.inf if took is None else took
        now, wall = clock.monotonic(), clock.wall()
        ejection = self._ejections.eject(name, now=now, wall=wall, healthy=self._slots.keys(), took=took)
        if ejection is None:
            if name in self._slots:
                self._hold(name, now, wall, took)
            return None
        log.info("shard %s ejected for %.1fs (ejection #%d in a row)", name, ejection.seconds, ejection.count)
        self._recompute()
        self._schedule_expiry()
        return ejection

    def _hold(self, name: str, now: float, wall: float, took: float) -> None:
        """The panic rule kept ``name`` in rotation: hold it for the backoff instead (see ``ejection``)."""
        seconds = self._ejections.hold(name, now=now, wall=wall, schedule=self._backoff, took=took)
        if seconds is not None:
            log.debug("shard %s held for %.3gs (the panic rule keeps it from being ejected)", name, seconds)
            self._metrics.hold(name)
            self._refresh_pickable()
            self._schedule_expiry()

    def _backoff(self, failures: int) -> float:
        """The backoff for the n-th failure in a row, without jitter: how long a held shard waits, and a probe's
        grace before it restores a shard ejected n times in a row."""
        return backoff_seconds(self._policy, failures, 0.0)

    def _schedule_expiry(self) -> None:
        self.close()
        due = self._ejections.next_expiry()
        if due is None:
            return

        def expire() -> None:
            self._expiry_timer = None
            # The timer fired for ``due``: the loop may run it a clock resolution early, never late by design.
            held = self._ejections.held
            restored = self._ejections.expire(max(self._now(), due))
            for name in restored:
                self._emit(ShardRestored(name, "expired"))
            if restored:
                self._recompute()
            elif held != self._ejections.held:
                self._refresh_pickable()
            self._schedule_expiry()

        self._expiry_timer = self._running_loop().call_later(max(0.0, due - self._now()), expire)

    def _recompute(self, revision: str | None = None) -> None:
        slots = list(self._slots.values())
        routable = [slot for slot in slots if not self._ejections.is_ejected(slot.name)]
        self._panic = not routable and bool(slots)
        if self._panic:
            log.warning("every healthy shard is ejected: routing to all of them (panic mode)")
            routable = slots
        self._routable = routable
        self._metrics.healthy_shards = len(routable)
        self._emit(
            HealthyShardsChanged(
                revision=revision or (self._snapshot.revision if self._snapshot else ""),
                healthy=tuple(self._slots),
                routable=tuple(slot.name for slot in routable),
            )
        )
        self._refresh_pickable()

    def _refresh_pickable(self, now: float | None = None) -> None:
        """Held shards, and one on trial with its room used, wait (see ``ejection``); so do attempts when no other
        shard is left. Routable still counts them: they are in rotation and back within the backoff."""
        ejections, now = self._ejections, self._now() if now is None else max(now, self._now())
        self._pickable = [
            slot
            for slot in self._routable
            if not ejections.is_held(slot.name)
            and not (
                slot.trial_attempts
                and self._on_trial(slot.name)
                and slot.trial_attempts >= ejections.trial_room(slot.name, since=slot.trial_started, now=now)[0]
            )
        ]
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    def _on_trial(self, name: str) -> bool:
        """Restored and not yet served, or ejected and routed to anyway in panic mode (see ``ejection``)."""
        ejections = self._ejections
        return ejections.on_trial(name) or (self._panic and ejections.is_ejected(name))

    def _bound_clock(self) -> Clock:
        assert self._clock is not None, "the rotation has not been started"
        return self._clock

    def _now(self) -> float:
        return self._bound_clock().monotonic()

    def _running_loop(self) -> asyncio.AbstractEventLoop:
        assert self._loop is not None, "the rotation has not been started"
        return self._loop
