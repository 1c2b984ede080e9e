#!/usr/bin/env python3
"""The cluster tier's images, built on this machine with no registry and no base image pulled.

``operator/Dockerfile`` stays the source of truth for what the operator image holds; this reads its runtime stage and
builds the same thing from Debian's packages (the issue-36 node cannot pull ``python:3.11-slim``):

- **operator** (also the sim shards' and the verifier's image, as in examples/): a Debian rootfs of the base's suite
  with its Python minor version (``mmdebstrap --variant=essential``, python3.X-venv), the Dockerfile's virtualenv
  path with the hash-checked lock installed by pip ``--require-hashes --no-deps`` and the project wheel
  ``--no-deps``, bytecode compiled, and the runtime stage's ENV, USER, WORKDIR, EXPOSE, ENTRYPOINT, CMD and LABELs.
  It is not byte-identical to a docker build (Debian's python3.11 rather than python.org's 3.11.x, a Debian
  rootfs rather than the slim image's), so ``tests/unit/test_node_images.py`` checks the two agree on the rest.
- **pause**: the pod sandbox, ``tools/node/pause.c`` built static, alone in its image.

Images are written by umoci (OCI image layout, one layer) and tarred for ``ctr images import``. Standard library
only, like pins.py. Cached under ``$ROLLOUT_FLEET_CACHE/images/``, keyed by what goes in.

Usage:
    images.py node                          build this checkout's pause and operator images once; print their dir
    images.py spec                          the operator image's spec, read from operator/Dockerfile (JSON)
    images.py pause OUT.tar                 build the pause image
    images.py operator OUT.tar WHEEL        build the operator image around WHEEL
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

from pins import versions

ROOT = Path(__file__).resolve().parent.parent
DOCKERFILE = ROOT / "operator" / "Dockerfile"
PAUSE_SOURCE = ROOT / "tools" / "node" / "pause.c"
DEBIAN_MIRROR = "http://deb.debian.org/debian"
DEBIAN_GLIBC = {"bookworm": 36, "trixie": 41}
"""glibc 2.x of each Debian suite: the newest manylinux tag its Python runs."""
BASE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
"""PATH of the Dockerfile's base image (and of any Debian image), what ``$PATH`` in its ENV expands to."""


@dataclass(frozen=True)
class Instruction:
    keyword: str
    args: str


def parse(text: str) -> list[Instruction]:
    """Dockerfile instructions: comments dropped, backslash continuations joined, keywords upper-cased."""
    logical: list[str] = []
    current = ""
    for raw in text.splitlines():
        line = raw.strip()
        if line.startswith("#") or (not current and not line):
            continue
        if line.endswith("\\"):
            current += line[:-1] + " "
            continue
        logical.append(current + line)
        current = ""
    return [Instruction(kw.upper(), args.strip()) for kw, _, args in (line.partition(" ") for line in logical)]


@dataclass(frozen=True)
class ImageSpec:
    """What the Dockerfile's image is, in the terms this builder needs."""

    suite: str
    """Debian suite of the base image (``bookworm`` in ``python:3.11.14-slim-bookworm``)."""
    python: str
    """Python minor version of the base image (``3.11``)."""
    venv: str
    """The virtualenv the runtime stage copies from the build stage."""
    lock: str
    """The hash-checked lock installed into it, as a path in the repository."""
    env: dict[str, str] = field(default_factory=dict)
    user: str = ""
    workdir: str = ""
    exposed: list[str] = field(default_factory=list)
    entrypoint: list[str] = field(default_factory=list)
    cmd: list[str] = field(default_factory=list)
    labels: dict[str, str] = field(default_factory=dict)


def _stages(instructions: list[Instruction]) -> list[list[Instruction]]:
    groups: list[list[Instruction]] = []
    for ins in instructions:
        if ins.keyword == "FROM":
            groups.append([])
        if groups:
            groups[-1].append(ins)
    return groups


def _pairs(args: str) -> dict[str, str]:
    """``KEY=value KEY2="v 2"`` (ENV and LABEL), values unquoted."""
    return dict(item.split("=", 1) for item in shlex.split(args))


def dockerfile_spec(text: str) -> ImageSpec:
    """Read the runtime stage (the last) and what it copies from the build stage."""
    instructions = parse(text)
    args = dict(ins.args.split("=", 1) for ins in instructions if ins.keyword == "ARG" and "=" in ins.args)
    stages = _stages(instructions)
    build, runtime = stages[0], stages[-1]
    base = re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], runtime[0].args.split()[0])
    tag = base.split("@", 1)[0].rsplit(":", 1)[1]  # 3.11.14-slim-bookworm
    version = re.match(r"(\d+\.\d+)\.\d+-.*-(\w+)$", tag)
    if version is None:
        raise ValueError(f"cannot read a Python version and Debian suite from the base tag {tag!r}")
    (copy,) = [ins.args.split() for ins in runtime if ins.keyword == "COPY"]
    venv = copy[-1]
    copies = {parts[-1]: parts[0] for ins in build if ins.keyword == "COPY" for parts in [ins.args.split()]}
    installs = [run for ins in build if ins.keyword == "RUN" for run in ins.args.split("&&")]
    (lock_in_image,) = [
        m.group(1) for run in installs if run.strip().startswith(f"{venv}/bin/pip install")
        for m in [re.search(r"--require-hashes .*-r (\S+)", run)] if m
    ]  # fmt: skip
    spec = ImageSpec(suite=version.group(2), python=version.group(1), venv=venv, lock=copies[lock_in_image])
    for ins in runtime:
        if ins.keyword == "ENV":
            spec.env.update({k: v.replace("$PATH", BASE_PATH) for k, v in _pairs(ins.args).items()})
        elif ins.keyword == "LABEL":
            spec.labels.update(_pairs(ins.args))
        elif ins.keyword == "EXPOSE":
            spec.exposed.extend(p if "/" in p else f"{p}/tcp" for p in ins.args.split())
        elif ins.keyword in ("ENTRYPOINT", "CMD"):
            getattr(spec, ins.keyword.lower()).extend(json.loads(ins.args))
    users = [ins.args for ins in runtime if ins.keyword == "USER"]
    workdirs = [ins.args for ins in runtime if ins.keyword == "WORKDIR"]
    last = {"user": users[-1] if users else "", "workdir": workdirs[-1] if workdirs else ""}
    return ImageSpec(**{**asdict(spec), **last})


# --- building -------------------------------------------------------------------------------------------------


def _cache() -> Path:
    root = Path(os.environ.get("ROLLOUT_FLEET_CACHE", Path.home() / ".cache" / "rollout-fleet"))
    return root / "images"


def _tool(name: str, version_key: str) -> Path:
    """A tool install-tools.sh unpacked (mmdebstrap, umoci): its bin wrapper."""
    path = _cache().parent / "tools" / f"{name}-{versions()[version_key]}" / "bin" / name
    if not path.exists():
        raise SystemExit(f"images: {path} is missing: run `bash scripts/install-tools.sh {name}`")
    return path


def _run(*argv: str | os.PathLike[str], env: dict[str, str] | None = None) -> None:
    """Run a build step; the machine's PIP_* settings never reach the image's pip (they name host paths)."""
    env = env if env is not None else {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    done = subprocess.run(
        [os.fspath(a) for a in argv], capture_output=True, text=True, env=env, stdin=subprocess.DEVNULL, check=False
    )
    if done.returncode != 0:
        tail = "\n".join((done.stdout + done.stderr).splitlines()[-30:])
        raise SystemExit(f"images: {' '.join(map(str, argv[:3]))}... failed ({done.returncode}):\n{tail}")


def _digest(*parts: bytes) -> str:
    h = hashlib.sha256()
    for part in parts:
        h.update(hashlib.sha256(part).digest())
    return h.hexdigest()[:16]


def _oci(rootfs: Path, out: Path, *, tag: str, config: list[str]) -> None:
    """rootfs -> one-layer OCI image tagged ``tag`` (umoci), tarred to ``out`` for ``ctr images import``."""
    umoci = _tool("umoci", "UMOCI_VERSION")
    with tempfile.TemporaryDirectory(dir=out.parent) as work:
        layout, bundle = Path(work) / "layout", Path(work) / "bundle"
        image = f"{layout}:{tag}"
        _run(umoci, "init", "--layout", layout)
        _run(umoci, "new", "--image", image)
        _run(umoci, "unpack", "--image", image, bundle)
        (bundle / "rootfs").rmdir()
        rootfs.rename(bundle / "rootfs")
        _run(umoci, "repack", "--image", image, bundle)
        _run(umoci, "config", "--image", image, *config)
        _run(umoci, "gc", "--layout", layout)
        partial = out.with_suffix(".partial")
        _run("tar", "-C", layout, "-cf", partial, ".")
        partial.rename(out)


PAUSE_TAG = "3.10"
"""The tag of Kubernetes' pause image that kubelet 1.35 and containerd's sandbox_image name."""


def build_pause(out: Path) -> None:
    with tempfile.TemporaryDirectory(dir=out.parent) as work:
        rootfs = Path(work) / "rootfs"
        rootfs.mkdir()
        _run(os.environ.get("CC", "gcc"), "-Os", "-static", "-s", "-o", rootfs / "pause", PAUSE_SOURCE)
        _oci(rootfs, out, tag=PAUSE_TAG, config=["--config.entrypoint=/pause"])


def _rootfs(spec: ImageSpec) -> Path:
    """The Debian rootfs with the base's Python (cached: it changes only with the suite or Python version)."""
    key = f"debian-{spec.suite}-python{spec.python}"
    done = _cache() / key
    if (done / ".complete").exists():
        return done / "rootfs"
    shutil.rmtree(done, ignore_errors=True)
    done.mkdir(parents=True)
    mmdebstrap = _tool("mmdebstrap", "MMDEBSTRAP_VERSION")
    env = {**os.environ, "PATH": f"{mmdebstrap.parent.parent / 'root' / 'usr' / 'bin'}:{os.environ['PATH']}"}
    excluded = ["/usr/share/doc/*", "/usr/share/man/*", "/usr/share/locale/*", "/usr/share/info/*"]
    _run(
        mmdebstrap, "--mode=root", "--variant=essential", f"--include=python{spec.python}-venv",
        "--aptopt=Acquire::Languages \"none\"", *(f"--dpkgopt=path-exclude={p}" for p in excluded),
        spec.suite, done / "rootfs", DEBIAN_MIRROR, env=env,
    )  # fmt: skip
    (done / ".complete").touch()
    return done / "rootfs"


def _platforms(spec: ImageSpec) -> list[str]:
    """``--platform`` for every manylinux tag the image's glibc runs (this pip does not expand them itself)."""
    glibc = DEBIAN_GLIBC[spec.suite]
    machine = platform.machine()
    tags = [f"manylinux_2_{minor}_{machine}" for minor in range(glibc, 4, -1)]
    tags += [f"{alias}_{machine}" for alias in ("manylinux2014", "manylinux2010", "manylinux1")]
    return [f"--platform={tag}" for tag in tags]


def _wheels(spec: ImageSpec, lock: bytes) -> Path:
    """The lock's wheels for the image's Python and this machine's architecture, downloaded once per lock by the
    host's pip (which trusts what this machine trusts) and hash-checked again when the image's pip installs them."""
    done = _cache() / f"wheels-{_digest(lock, spec.python.encode(), platform.machine().encode())}"
    if (done / ".complete").exists():
        return done
    shutil.rmtree(done, ignore_errors=True)
    done.mkdir(parents=True)
    (done / "requirements.lock").write_bytes(lock)
    pip = _cache().parent / f"uv-{versions()['UV_VERSION']}" / "bin" / "python"  # scripts/uv.sh's venv has pip
    _run(
        pip if pip.exists() else sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check",
        "--require-hashes", "--no-deps", "--only-binary=:all:", f"--python-version={spec.python}",
        "--implementation=cp", *_platforms(spec), "-r", done / "requirements.lock",
        "-d", done, env={k: v for k, v in os.environ.items() if k != "PIP_FIND_LINKS"},
    )  # fmt: skip
    (done / "requirements.lock").unlink()
    (done / ".complete").touch()
    return done


def build_operator(out: Path, wheel: Path, spec: ImageSpec, tag: str) -> None:
    lock = (ROOT / spec.lock).read_bytes()
    with tempfile.TemporaryDirectory(dir=out.parent) as work:
        rootfs = Path(work) / "rootfs"
        _run("cp", "-a", _rootfs(spec), rootfs)
        _run("chroot", rootfs, f"python{spec.python}", "-m", "venv", spec.venv)
        wheels = _wheels(spec, lock)
        staged = rootfs / "tmp" / "build"
        shutil.copytree(wheels, staged, ignore=shutil.ignore_patterns(".complete"))
        shutil.copy(wheel, staged / wheel.name)
        (staged / "requirements.lock").write_bytes(lock)
        pip = [f"{spec.venv}/bin/pip", "install", "--quiet", "--disable-pip-version-check", "--no-index"]
        locked = ["--find-links=/tmp/build", "--require-hashes", "--no-deps", "-r", "/tmp/build/requirements.lock"]
        _run("chroot", rootfs, *pip, *locked)
        _run("chroot", rootfs, *pip, "--no-deps", f"/tmp/build/{wheel.name}")
        _run("chroot", rootfs, f"{spec.venv}/bin/python", "-m", "compileall", "-q", f"{spec.venv}/lib")
        _run("chroot", rootfs, f"{spec.venv}/bin/rollout-fleet", "--version")
        shutil.rmtree(staged)
        for cache in (rootfs / "root" / ".cache", rootfs / "var" / "cache" / "apt"):
            shutil.rmtree(cache, ignore_errors=True)
        config = [f"--config.user={spec.user}", f"--config.workingdir={spec.workdir}"]
        config += [f"--config.env={k}={v}" for k, v in spec.env.items()]
        config += [f"--config.entrypoint={a}" for a in spec.entrypoint] + [f"--config.cmd={a}" for a in spec.cmd]
        config += [f"--config.exposedports={p}" for p in spec.exposed]
        config += [f"--config.label={k}={v}" for k, v in spec.labels.items()]
        _oci(rootfs, out, tag=tag, config=config)


def chart_tag() -> str:
    """The image tag the chart and examples/ run: the chart's appVersion."""
    chart = (ROOT / "charts" / "rollout-fleet" / "Chart.yaml").read_text()
    match = re.search(r'^appVersion:\s*"?([^"\s]+)"?', chart, flags=re.MULTILINE)
    if match is None:
        raise SystemExit("images: charts/rollout-fleet/Chart.yaml has no appVersion")
    return match.group(1)


SOURCES = ("pyproject.toml", "README.md", "operator/Dockerfile", "charts/rollout-fleet/Chart.yaml",
           "tools/images.py", "tools/node/pause.c")  # fmt: skip
KEEP = 3
"""Image sets kept in the cache (one per source state; each ~90 MB): the newest few, for checkouts side by side."""


def source_key(spec: ImageSpec) -> str:
    """What the node's images are built from: this file, the Dockerfile and its lock, the wheel's sources."""
    files = [ROOT / name for name in (*SOURCES, spec.lock)]
    for package in ("runtime/rollout_runtime", "operator/fleet_operator"):
        files += sorted(p for p in (ROOT / package).rglob("*") if p.is_file() and "__pycache__" not in p.parts)
    return _digest(*(f"{f.relative_to(ROOT)}\0".encode() + f.read_bytes() for f in files))


def node_images(spec: ImageSpec) -> Path:
    """pause.tar and operator.tar for this checkout, built once per source state (printed by ``images.py node``)."""
    done = _cache() / f"node-{source_key(spec)}"
    if (done / ".complete").exists():
        return done
    shutil.rmtree(done, ignore_errors=True)
    done.mkdir(parents=True)
    with tempfile.TemporaryDirectory(dir=done) as dist:
        wheel_build: list[str | os.PathLike[str]] = [ROOT / "scripts" / "build-wheel", dist]
        built = subprocess.run(wheel_build, capture_output=True, text=True, check=False, stdin=subprocess.DEVNULL)
        if built.returncode != 0:
            raise SystemExit(f"images: scripts/build-wheel failed:\n{built.stderr}")
        wheel = Path(built.stdout.strip().splitlines()[-1])
        build_pause(done / "pause.tar")
        build_operator(done / "operator.tar", wheel, spec, chart_tag())
    (done / ".complete").touch()
    older = sorted(_cache().glob("node-*"), key=lambda p: p.stat().st_mtime, reverse=True)[KEEP:]
    for stale in older:
        shutil.rmtree(stale, ignore_errors=True)
    return done


def main(argv: list[str]) -> int:
    spec = dockerfile_spec(DOCKERFILE.read_text())
    if argv == ["spec"]:
        print(json.dumps(asdict(spec), indent=2))
        return 0
    if argv == ["node"]:
        print(node_images(spec))
        return 0
    if argv[:1] == ["pause"] and len(argv) == 2:
        build_pause(Path(argv[1]).resolve())
        return 0
    if argv[:1] == ["operator"] and len(argv) == 3:
        build_operator(Path(argv[1]).resolve(), Path(argv[2]).resolve(), spec, chart_tag())
        return 0
    print(__doc__.split("Usage:", 1)[1].rstrip(), file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
