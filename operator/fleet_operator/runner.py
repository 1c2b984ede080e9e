"""Runs the operator: HTTP endpoints always; when leading, the engine plus kopf's watches; graceful shutdown.

One process, one loop::

    serve /healthz /readyz /metrics
    rehearse (with leader election): prime a throwaway engine and start kopf until it is ready, then stop it;
             only a replica that got this far is Ready as a standby or may campaign
    loop until stopped:
        standby: campaign for the Lease (skipped without leader election)
        leader:  prime the engine (list everything once), then run together
                   kopf.operator (watches -> handlers -> engine),
                   engine.run  (probes, coalesced writes),
                   lease renewal
                 until stop (SIGTERM/SIGINT or the caller's event) or the Lease is lost
        on stop: stop kopf, flush pending transitions, release the Lease (a standby takes over at once)
        on loss: stop at once without flushing (another replica leads now), campaign again

kopf installs its own SIGTERM/SIGINT handlers while it runs; the runner reads kopf ending without an error as
"a signal arrived" and re-installs its own handlers for the standby phase.

Why the rehearsal: a Deployment's rolling update (and ``helm upgrade --wait``) removes an old pod as soon as a new
one is Ready. A standby that is Ready before it has ever started kopf lets a new version that cannot lead (a crash in
kopf's start-up, RBAC it lacks, CRDs it cannot list) replace the working leader. The rehearsal writes nothing: the
throwaway engine is never run, so it neither probes nor patches, and kopf's handlers only feed it (docs/operator.md,
"Readiness and rolling updates").

kopf is always given the replica's identity (``settings.identity``, the pod name in the chart): left to itself kopf
derives one from ``getpass.getuser()``, which raises in a container whose uid has no passwd entry (the chart's 65532).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import threading
from collections.abc import Coroutine
from typing import Any

import kopf
from kopf._cogs.structs.references import Insights  # kopf.operator(insights=...) takes it; kopf does not re-export it
from kubernetes_asyncio import client
from prometheus_client import CollectorRegistry

from fleet_operator.engine import FleetEngine
from fleet_operator.handlers import build_registry
from fleet_operator.kube import KubeClient, connection_info
from fleet_operator.leader import LeaderElector
from fleet_operator.metrics import FleetMetrics
from fleet_operator.server import RunnerState, serve_http
from fleet_operator.settings import OperatorSettings
from rollout_runtime.health import HttpProber, Prober
from rollout_runtime.kube.config import load_client_configuration

__all__ = ["OperatorRun", "run_operator"]

log = logging.getLogger(__name__)

_RETRY_SECONDS = 5.0


def _install_signal_handlers(stop: asyncio.Event) -> None:
    if threading.current_thread() is not threading.main_thread():
        return
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)


def _kopf_operator(
    settings: OperatorSettings,
    engine: FleetEngine,
    connection: kopf.ConnectionInfo,
    *,
    stop_flag: asyncio.Event,
    ready_flag: asyncio.Event,
    insights: Insights | None = None,
) -> Coroutine[Any, Any, None]:
    """kopf with this operator's handlers feeding ``engine``, under the replica's own identity (never getpass)."""
    return kopf.operator(
        insights=insights,
        registry=build_registry(pod_discovery=settings.pod_discovery),
        memo=kopf.Memo(engine=engine, connection=connection),
        identity=settings.identity,  # type: ignore[arg-type]  # kopf's Identity: NewType(str), not exported
        standalone=True,
        clusterwide=not settings.namespaces,
        namespaces=settings.namespaces,
        stop_flag=stop_flag,
        ready_flag=ready_flag,
    )


class OperatorRun:
    """One operator process's lifecycle (see the module docstring). Tests drive it with ``stop`` and ``state``."""

    def __init__(
        self,
        settings: OperatorSettings,
        *,
        stop: asyncio.Event | None = None,
        prober: Prober | None = None,
        registry: CollectorRegistry | None = None,
    ) -> None:
        self.settings = settings
        self.stop = stop or asyncio.Event()
        self.state = RunnerState(identity=settings.identity)
        self.metrics = FleetMetrics(registry)
        self.engine: FleetEngine | None = None
        self.port: int | None = None
        self.serving = asyncio.Event()
        """Set once the HTTP endpoints are up (``port`` is known)."""
        self._prober = prober

    async def run(self) -> int:
        settings = self.settings
        _install_signal_handlers(self.stop)
        configuration = await load_client_configuration(settings.kubeconfig)
        connection = await connection_info(configuration)
        async with (
            serve_http(settings.http_host, settings.http_port, self.metrics.registry, self.state) as port,
            client.ApiClient(configuration) as api_client,
        ):
            self.port = port
            self.serving.set()
            elector = (
                LeaderElector(
                    api_client,
                    name=settings.lease_name,
                    namespace=settings.lease_namespace,
                    identity=settings.identity,
                    duration_seconds=settings.lease_duration_seconds,
                    renew_seconds=settings.lease_renew_seconds,
                )
                if settings.leader_election
                else None
            )
            if elector is not None:
                try:
                    if not await self._rehearse(configuration, connection):
                        self.stop.set()
                except Exception as exc:
                    log.exception("this replica cannot lead: it stays unready and does not campaign")
                    self.state.failure = f"cannot lead: {type(exc).__name__}: {exc}"[:500]
                    return 1
                finally:
                    _install_signal_handlers(self.stop)
            while not self.stop.is_set():
                if elector is not None:
                    self.state.role = "standby"
                    if not await elector.acquire(self.stop):
                        break
                self.state.role = "leader"
                try:
                    lost = await self._lead(configuration, connection, elector)
                except Exception as exc:
                    log.exception("leadership term failed")
                    self.state.failure = f"{type(exc).__name__}: {exc}"[:500]
                    if elector is not None:
                        await elector.release()
                    return 1
                finally:
                    self.state.synced = False
                    _install_signal_handlers(self.stop)
                if not lost:
                    break
            self.state.role = "stopping"
            if elector is not None:
                await elector.release()
        return 0

    async def _lead(
        self, configuration: client.Configuration, connection: kopf.ConnectionInfo, elector: LeaderElector | None
    ) -> bool:
        """One leadership term; returns True if leadership was lost (rather than the operator stopped)."""
        settings = self.settings
        kube = KubeClient(configuration, component=settings.reporting_component, instance=settings.identity)
        prober = self._prober or HttpProber(settings.probe_policy(), max_body_bytes=settings.probe_max_body_bytes)
        engine = FleetEngine(settings, kube, prober, metrics=self.metrics)
        self.engine = engine
        lost = asyncio.Event()
        hold = asyncio.create_task(self._hold(elector, lost), name="lease") if elector is not None else None
        try:
            prime = asyncio.create_task(engine.prime(), name="prime")
            waiting = {prime, asyncio.create_task(self.stop.wait(), name="stop")} | ({hold} if hold else set())
            await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
            if not prime.done():  # stopped or lost the Lease while listing
                prime.cancel()
                return lost.is_set()
            prime.result()
            kopf_stop, kopf_ready = asyncio.Event(), asyncio.Event()
            kopf_task = asyncio.create_task(
                _kopf_operator(settings, engine, connection, stop_flag=kopf_stop, ready_flag=kopf_ready), name="kopf"
            )
            engine_task = asyncio.create_task(engine.run(), name="fleet-engine")
            synced = asyncio.create_task(self._mark_synced(kopf_ready), name="kopf-ready")
            watch = {kopf_task, engine_task, asyncio.create_task(self.stop.wait(), name="stop")}
            if hold is not None:
                watch.add(hold)
            done, pending = await asyncio.wait(watch, return_when=asyncio.FIRST_COMPLETED)
            if kopf_task in done and kopf_task.exception() is None and not lost.is_set():
                self.stop.set()  # kopf ended cleanly: it received SIGTERM/SIGINT
            kopf_stop.set()
            synced.cancel()
            for task in pending:
                if task is not kopf_task:
                    task.cancel()
            with contextlib.suppress(TimeoutError, asyncio.CancelledError):
                await asyncio.wait_for(asyncio.shield(kopf_task), timeout=settings.shutdown_timeout_seconds)
            for task in (kopf_task, engine_task):
                if task.done() and not task.cancelled() and task.exception() is not None:
                    raise RuntimeError(f"{task.get_name()} failed") from task.exception()
            if not lost.is_set():
                await self._flush(engine)
            return lost.is_set()
        finally:
            self.metrics.clear_state()  # only the leader speaks for the fleet
            if hold is not None and not hold.done():
                hold.cancel()
            if self._prober is None and isinstance(prober, HttpProber):
                await prober.close()
            await kube.close()

    async def _mark_synced(self, kopf_ready: asyncio.Event) -> None:
        """A leader is Ready once primed *and* kopf has started (not merely primed)."""
        await kopf_ready.wait()
        self.state.synced = True
        self.state.can_lead = True

    @staticmethod
    async def _kopf_started(kopf_ready: asyncio.Event, insights: Insights) -> None:
        """kopf ran its start-up and discovered the resources it watches: stopping it earlier races that discovery
        (kopf logs its cancelled requests as errors and retries them for seconds)."""
        await kopf_ready.wait()
        await insights.ready_resources.wait()

    async def _rehearse(self, configuration: client.Configuration, connection: kopf.ConnectionInfo) -> bool:
        """Everything a leadership term starts, minus the writes: prime a throwaway engine (credentials, RBAC to
        list, CRDs served), then run kopf until it is ready (its identity, handlers and start-up) and stop it.
        True once done (the replica is Ready and may campaign); False if stopped meanwhile; raises if it cannot."""
        settings = self.settings
        kube = KubeClient(configuration, component=settings.reporting_component, instance=settings.identity)
        prober = HttpProber(settings.probe_policy(), max_body_bytes=settings.probe_max_body_bytes)
        engine = FleetEngine(settings, kube, prober, metrics=FleetMetrics())  # never run: no probe, no write
        stopping = asyncio.create_task(self.stop.wait(), name="stop")
        try:
            prime = asyncio.create_task(engine.prime(), name="rehearsal-prime")
            await asyncio.wait({prime, stopping}, return_when=asyncio.FIRST_COMPLETED)
            if not prime.done():
                prime.cancel()
                return False
            prime.result()
            kopf_stop, kopf_ready, insights = asyncio.Event(), asyncio.Event(), Insights()
            kopf_task = asyncio.create_task(
                _kopf_operator(
                    settings, engine, connection, stop_flag=kopf_stop, ready_flag=kopf_ready, insights=insights
                ),
                name="rehearsal-kopf",
            )
            ready = asyncio.create_task(self._kopf_started(kopf_ready, insights), name="rehearsal-kopf-ready")
            await asyncio.wait({kopf_task, ready, stopping}, return_when=asyncio.FIRST_COMPLETED)
            started = ready.done() and not ready.cancelled()
            kopf_stop.set()
            ready.cancel()
            with contextlib.suppress(TimeoutError, asyncio.CancelledError):
                await asyncio.wait_for(asyncio.shield(kopf_task), timeout=settings.shutdown_timeout_seconds)
            if not kopf_task.done():
                kopf_task.cancel()
            elif not kopf_task.cancelled() and kopf_task.exception() is not None:
                raise RuntimeError("kopf failed to start") from kopf_task.exception()
            if not started:  # stopped, or kopf ended cleanly before it was ready: a signal reached it
                self.stop.set()
                return False
            log.info("rehearsal passed: primed and started kopf as %s; ready to lead", settings.identity)
            self.state.can_lead = True
            return True
        finally:
            stopping.cancel()
            await prober.close()
            await kube.close()

    async def _hold(self, elector: LeaderElector, lost: asyncio.Event) -> None:
        await elector.hold(self.stop)
        if not self.stop.is_set():
            lost.set()

    async def _flush(self, engine: FleetEngine) -> None:
        """Write what is pending (transitions, dirty fleets) before handing over; bounded by the shutdown timeout."""
        loop = asyncio.get_running_loop()
        try:
            await asyncio.wait_for(
                engine.write_pass(loop.time() + self.settings.fleet_coalesce_seconds),
                timeout=self.settings.shutdown_timeout_seconds,
            )
        except TimeoutError:
            log.warning("shutdown flush timed out; the next leader re-derives the statuses")


async def run_operator(settings: OperatorSettings) -> int:
    """``rollout-fleet operator``: configure logging and run until SIGTERM/SIGINT; the exit code."""
    logging.basicConfig(level=settings.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("kubernetes_asyncio").setLevel(max(logging.INFO, logging.getLogger().level))
    if settings.log_level != "DEBUG":  # kopf logs every handled event; our status writes echo back as events
        logging.getLogger("kopf.objects").setLevel(logging.WARNING)
    return await OperatorRun(settings).run()
