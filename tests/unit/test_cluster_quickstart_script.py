"""README's cluster quickstart is the cluster tier's own script: scripts/cluster-quickstart runs each of its commands.

The tier (tests/cluster/) runs the script on a real node; this keeps the README from drifting away from what runs.
"""

from __future__ import annotations

import re
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]


def readme_quickstart() -> list[str]:
    """The commands of README's "Quickstart on any cluster" block (comments and blank lines dropped)."""
    readme = (REPO_ROOT / "README.md").read_text()
    block = re.search(r"Quickstart on any cluster.*?```bash\n(.*?)```", readme, flags=re.DOTALL)
    assert block, "README has no cluster quickstart block"
    return [line.strip() for line in block.group(1).splitlines() if line.strip() and not line.startswith("#")]


def script_commands() -> list[str]:
    text = (REPO_ROOT / "scripts" / "cluster-quickstart").read_text()
    lines = [line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    return [line.replace('"$HELM"', "helm") for line in lines]


def test_every_readme_quickstart_command_is_run_by_the_tiers_script_in_order() -> None:
    commands, script = readme_quickstart(), script_commands()
    assert commands
    positions = []
    for command in commands:
        found = [i for i, line in enumerate(script) if line.startswith(command)]
        assert found, f"scripts/cluster-quickstart does not run README's {command!r}"
        positions.append(found[0])
    assert positions == sorted(positions), "the script runs README's commands in another order"
