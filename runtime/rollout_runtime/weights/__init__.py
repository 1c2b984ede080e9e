"""Weights versions: which policy a shard holds, how a restart is detected, and whether a result may be committed.

- :mod:`.gate`: the pure commit decision (:func:`weights_verdict`) and what the dispatcher reads (:class:`WeightsView`).
- :mod:`.identity`: pluggable instance-identity sources (SGLang, vLLM, ``/metrics`` start time, supplied, outage).
- :mod:`.tracker`: the trainer's API (:class:`WeightsTracker`: publish, refit, refit_all, identity polling).
- :mod:`.refit`: the refit sequence (drain, update, identity, record; Stale on failure) and the version rules that
  :class:`WeightsTracker` and the cluster's ``PolicyVersionWriter`` share.
- :mod:`.refitter`: SGLang's ``update_weights_from_disk`` and vLLM's dev-mode reload as update functions;
  :class:`StaleRefitter` refits shards that came back Stale.

The states (Stale, Refitting) live in the one shared health state machine, :mod:`rollout_runtime.health.hysteresis`.
"""

from rollout_runtime.weights.gate import MAX_LAG_LABEL, WeightsVerdict, WeightsView, lag_label, weights_verdict
from rollout_runtime.weights.identity import (
    DEFAULT_IDENTITY_TIMEOUT_SECONDS,
    IdentitySource,
    OutageEpochs,
    ProcessStartTime,
    SGLangWeightVersion,
    SuppliedIdentity,
    VllmWeightInfo,
    parse_process_start_time,
    parse_weight_version,
)
from rollout_runtime.weights.refit import RefitError
from rollout_runtime.weights.refitter import StaleRefitter, update_weights_from_disk, vllm_reload_weights
from rollout_runtime.weights.tracker import StateHost, WeightsTracker

__all__ = [
    "DEFAULT_IDENTITY_TIMEOUT_SECONDS",
    "MAX_LAG_LABEL",
    "IdentitySource",
    "OutageEpochs",
    "ProcessStartTime",
    "RefitError",
    "SGLangWeightVersion",
    "StaleRefitter",
    "StateHost",
    "SuppliedIdentity",
    "VllmWeightInfo",
    "WeightsTracker",
    "WeightsVerdict",
    "WeightsView",
    "lag_label",
    "parse_process_start_time",
    "parse_weight_version",
    "update_weights_from_disk",
    "vllm_reload_weights",
    "weights_verdict",
]
