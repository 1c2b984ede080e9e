"""Child processes for fixtures: the runtime's one process wrapper (:mod:`rollout_runtime.sim.process`).

Re-exported here so fixtures import from one place; the sim fleet and the benchmarks use the same class.
"""

from rollout_runtime.sim.process import ManagedProcess, free_port, free_ports, tail, until, wait_until

__all__ = ["ManagedProcess", "free_port", "free_ports", "tail", "until", "wait_until"]
