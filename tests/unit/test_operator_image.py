"""operator/Dockerfile, checked statically (there is no Docker engine here): pinned, multi-stage, non-root, locked.

The build itself was rehearsed outside Docker (same pip commands in fresh virtualenvs); these tests keep the recipe
from drifting: a floating base, a root user, an unhashed dependency or a port the chart does not expect fails here.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest
import yaml

from images import Instruction, parse  # tools/images.py: the one reading of the Dockerfile

REPO_ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = REPO_ROOT / "operator" / "Dockerfile"
DOCKERIGNORE = REPO_ROOT / "operator" / "Dockerfile.dockerignore"
LOCKS = [REPO_ROOT / "operator" / "requirements.lock", REPO_ROOT / "operator" / "build-requirements.lock"]
VALUES = REPO_ROOT / "charts" / "rollout-fleet" / "values.yaml"


def stages(instructions: list[Instruction]) -> list[list[Instruction]]:
    """Instructions grouped by build stage (each starts with FROM)."""
    groups: list[list[Instruction]] = []
    for ins in instructions:
        if ins.keyword == "FROM":
            groups.append([])
        if groups:
            groups[-1].append(ins)
    return groups


@pytest.fixture(scope="module")
def instructions() -> list[Instruction]:
    return parse(DOCKERFILE.read_text())


def _arg_defaults(instructions: list[Instruction]) -> dict[str, str]:
    defaults = {}
    for ins in instructions:
        if ins.keyword == "ARG" and "=" in ins.args:
            name, _, value = ins.args.partition("=")
            defaults[name] = value.strip('"')
    return defaults


def _image(from_args: str, defaults: dict[str, str]) -> str:
    image = from_args.split()[0]
    return re.sub(r"\$\{(\w+)\}", lambda m: defaults[m.group(1)], image)


def test_parser_joins_continuations_and_drops_comments() -> None:
    parsed = parse("# c\nFROM a AS b\nRUN x \\\n # inner\n && y\nUSER 1:1\n")
    assert parsed == [Instruction("FROM", "a AS b"), Instruction("RUN", "x  && y"), Instruction("USER", "1:1")]


def test_every_stage_uses_a_base_pinned_by_exact_tag_and_digest(instructions: list[Instruction]) -> None:
    defaults = _arg_defaults(instructions)
    bases = [_image(ins.args, defaults) for ins in instructions if ins.keyword == "FROM"]
    assert bases
    for base in bases:
        match = re.fullmatch(r"[\w./-]+:(?P<tag>[\w.-]+)@sha256:[0-9a-f]{64}", base)
        assert match, f"base {base!r} is not pinned by tag and sha256 digest"
        assert re.match(r"\d+\.\d+\.\d+-", match.group("tag")), f"tag of {base!r} is not an exact version"


def test_build_is_multi_stage_and_the_runtime_stage_copies_only_the_virtualenv(
    instructions: list[Instruction],
) -> None:
    groups = stages(instructions)
    assert len(groups) >= 2
    runtime = groups[-1]
    copies = [ins.args for ins in runtime if ins.keyword == "COPY"]
    assert copies == ["--from=build /opt/rollout-fleet /opt/rollout-fleet"]
    assert not [ins for ins in runtime if ins.keyword == "RUN"], "the runtime stage must not run build steps"


def test_runtime_stage_runs_as_the_non_root_uid_the_chart_expects(instructions: list[Instruction]) -> None:
    runtime = stages(instructions)[-1]
    users = [ins.args for ins in runtime if ins.keyword == "USER"]
    assert users, "the runtime stage sets no USER (it would run as root)"
    uid, _, gid = users[-1].partition(":")
    assert uid.isdigit(), "USER must be numeric so runAsNonRoot can verify it"
    assert int(uid) != 0
    assert gid.isdigit()
    assert int(gid) != 0
    values = yaml.safe_load(VALUES.read_text())
    assert values["podSecurityContext"]["runAsUser"] == int(uid)
    assert values["podSecurityContext"]["runAsGroup"] == int(gid)


def runtime_env(instructions: list[Instruction]) -> dict[str, str]:
    """The runtime stage's ENV, as KEY=value pairs."""
    pairs = [pair for ins in stages(instructions)[-1] if ins.keyword == "ENV" for pair in ins.args.split()]
    return dict(pair.split("=", 1) for pair in pairs)


def test_the_image_needs_no_name_for_its_uid_and_home_is_the_writable_scratch_mount(
    instructions: list[Instruction],
) -> None:
    """Issue 36: the uid has no passwd entry in the image. USER/LOGNAME in the image would hide a getpass call
    (the e2e test runs the operator as the uid without them); HOME must be writable on a read-only root."""
    env = runtime_env(instructions)
    assert not {"USER", "LOGNAME", "LNAME", "USERNAME"} & set(env)
    assert env["HOME"] == "/tmp"
    deployment = (REPO_ROOT / "charts" / "rollout-fleet" / "templates" / "deployment.yaml").read_text()
    assert "mountPath: /tmp" in deployment


def test_entrypoint_runs_the_operator_on_the_port_the_chart_probes(instructions: list[Instruction]) -> None:
    runtime = stages(instructions)[-1]
    by_keyword = {ins.keyword: ins.args for ins in runtime}
    assert by_keyword["ENTRYPOINT"] == '["rollout-fleet"]'
    assert by_keyword["CMD"] == '["operator"]'
    values = yaml.safe_load(VALUES.read_text())
    assert by_keyword["EXPOSE"] == str(values["operator"]["httpPort"])


def test_every_pip_install_is_hash_checked_or_the_projects_own_wheel(instructions: list[Instruction]) -> None:
    runs = [ins.args for ins in instructions if ins.keyword == "RUN"]
    installs = [part for run in runs for part in run.split("&&") if "pip install" in part]
    assert installs
    for install in installs:
        assert "--require-hashes" in install or "/tmp/wheels/rollout_fleet-" in install, install
        assert "--no-deps" in install, f"{install!r} may resolve unpinned dependencies"


@pytest.mark.parametrize("lock", LOCKS, ids=lambda p: p.name)
def test_lock_files_pin_every_requirement_by_version_and_hash(lock: Path) -> None:
    text = lock.read_text()
    # name==version, then an environment marker where the dependency is platform-specific (uvloop: not Windows)
    requirements = re.findall(r"^([A-Za-z0-9_.-]+)==([^\s\\;]+)(?: ;[^\\\n]*)? \\$", text, flags=re.MULTILINE)
    assert requirements
    blocks = re.split(r"^(?=[A-Za-z0-9_.-]+==)", text, flags=re.MULTILINE)[1:]
    assert len(blocks) == len(requirements)
    for block in blocks:
        assert "--hash=sha256:" in block, block.splitlines()[0]


def test_locks_are_resolved_for_every_platform_so_one_build_serves_amd64_and_arm64() -> None:
    """A lock pinned for one platform (``--python-platform``) can omit what another needs; a universal one cannot.

    (Checked against the index when re-locking: both locks install with ``--require-hashes`` for
    ``x86_64-manylinux_2_28`` and ``aarch64-manylinux_2_28``.)"""
    script = (REPO_ROOT / "operator" / "lock.sh").read_text()
    compiles = [line for line in script.splitlines() if "pip compile" in line]
    assert len(compiles) == len(LOCKS)
    assert "--universal" in script
    assert "--python-platform" not in script
    assert "--python-version 3.11" in script, "the image's Python (python:3.11-slim-bookworm)"
    for lock in LOCKS:
        assert lock.name in "\n".join(compiles), f"{lock.name} is not written by operator/lock.sh"


def test_runtime_lock_covers_every_dependency_of_the_package() -> None:
    with (REPO_ROOT / "pyproject.toml").open("rb") as handle:
        dependencies = tomllib.load(handle)["project"]["dependencies"]
    wanted = {re.split(r"[<>=!~\[ ;]", dep, maxsplit=1)[0].lower().replace("_", "-") for dep in dependencies}
    locked = {name.lower() for name in re.findall(r"^([A-Za-z0-9_.-]+)==", LOCKS[0].read_text(), flags=re.MULTILINE)}
    assert wanted <= locked, f"operator/requirements.lock lacks {sorted(wanted - locked)}: run operator/lock.sh"


def test_build_context_ignore_file_admits_exactly_what_the_dockerfile_copies(instructions: list[Instruction]) -> None:
    admitted = {line[1:].rstrip("/") for line in DOCKERIGNORE.read_text().splitlines() if line.startswith("!")}
    sources = set()
    for ins in instructions:
        if ins.keyword == "COPY" and not ins.args.startswith("--from"):
            sources.update(part.rstrip("/") for part in ins.args.split()[:-1])
    assert sources == admitted
    for source in sources:
        assert (REPO_ROOT / source).exists(), source
