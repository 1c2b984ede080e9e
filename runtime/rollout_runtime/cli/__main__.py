"""``python -m rollout_runtime.cli`` runs the CLI without the console script (tests, odd installs)."""

from rollout_runtime.cli import main

main()
