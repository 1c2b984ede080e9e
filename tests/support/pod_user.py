"""Run a process the way a container runtime runs the chart's pods: as the pod's numeric uid and gid, with no
passwd entry for them, no supplementary groups and no ``USER``/``LOGNAME`` in the environment (what runc gives a
``runAsUser`` its image does not name: ``HOME=/``).

We are root on the test machine, so ``setpriv`` drops to that uid. Two things root has that the uid has not:
- the development interpreter lives under ``/root`` (mode 0700), so the process runs Debian's ``/usr/bin/python3``
  in a virtualenv whose ``.pth`` adds the checkout's site-packages (same packages, same CPython minor version);
- the test kubeconfig and its CA file are root's, so the process gets a copy it owns, with the CA embedded.
"""

from __future__ import annotations

import base64
import json
import os
import pwd
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from dataclasses import dataclass
from pathlib import Path

__all__ = ["PodUser", "has_passwd_entry", "process_ids"]

SYSTEM_PYTHON = Path("/usr/bin/python3")
SCRUBBED = ("USER", "LOGNAME", "LNAME", "USERNAME")
"""What getpass.getuser() reads before it falls back to the passwd database."""


def has_passwd_entry(uid: int) -> bool:
    try:
        pwd.getpwuid(uid)
    except KeyError:
        return False
    return True


def process_ids(pid: int) -> tuple[int, int]:
    """The real uid and gid of a running process (``/proc/PID/status``)."""
    fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line)
    return int(fields["Uid"].split()[0]), int(fields["Gid"].split()[0])


@dataclass
class PodUser:
    """A directory the uid owns, with a Python that can import the checkout, and the argv prefix that drops to it."""

    uid: int
    gid: int
    home: Path

    @classmethod
    def create(cls, uid: int, gid: int) -> PodUser:
        """A fresh directory outside pytest's 0700 temp tree (the uid must be able to reach it)."""
        version = subprocess.run(
            [SYSTEM_PYTHON, "-c", "import sys; print(sys.version_info[:2])"], capture_output=True, text=True
        ).stdout.strip()
        if version != str(sys.version_info[:2]):
            raise RuntimeError(
                f"{SYSTEM_PYTHON} is Python {version or '(missing)'}, the checkout's is {sys.version_info[:2]}: "
                "the pod-user tests need the same CPython minor version outside /root"
            )
        home = Path(tempfile.mkdtemp(prefix=f"rollout-fleet-uid{uid}-"))
        home.chmod(0o755)
        venv = home / "venv"
        subprocess.run([SYSTEM_PYTHON, "-m", "venv", "--without-pip", venv], check=True, capture_output=True)
        (site,) = venv.glob("lib/python3*/site-packages")
        (site / "checkout.pth").write_text(f"import site; site.addsitedir({sysconfig.get_paths()['purelib']!r})\n")
        os.chown(home, uid, gid)
        return cls(uid, gid, home)

    @property
    def python(self) -> Path:
        return self.home / "venv" / "bin" / "python"

    def argv(self, *args: str | os.PathLike[str]) -> list[str]:
        """``setpriv`` to the uid/gid (no groups, killed with its parent), then ``python ARGS``."""
        setpriv = shutil.which("setpriv")
        if setpriv is None:
            raise RuntimeError("setpriv (util-linux) is needed to run a process as the pod's uid")
        drop = [f"--reuid={self.uid}", f"--regid={self.gid}", "--clear-groups", "--pdeathsig=KILL"]
        return [setpriv, *drop, "--", str(self.python), *map(os.fspath, args)]

    def env(self, base: dict[str, str]) -> dict[str, str]:
        """``base`` without the variables getpass would read, with runc's HOME for a uid it cannot name."""
        return {key: value for key, value in base.items() if key not in SCRUBBED} | {"HOME": "/"}

    def kubeconfig(self, source: Path) -> Path:
        """A copy of ``source`` the uid can read: CA embedded, owned by the uid, mode 0600."""
        config = json.loads(source.read_text())
        for cluster in config["clusters"]:
            ca = cluster["cluster"].pop("certificate-authority", None)
            if ca is not None:
                cluster["cluster"]["certificate-authority-data"] = base64.b64encode(Path(ca).read_bytes()).decode()
        path = self.home / source.name
        path.write_text(json.dumps(config))
        path.chmod(0o600)
        os.chown(path, self.uid, self.gid)
        return path

    def remove(self) -> None:
        shutil.rmtree(self.home, ignore_errors=True)
