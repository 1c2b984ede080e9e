"""Prometheus servers scraping given targets, and promtool, for scrape, rule and dashboard-query tests.

Prometheus comes from Debian's package (see scripts/install-tools.sh). Each server gets its own port, config and
TSDB dir under pytest's temp dir, scrapes every second, and is stopped by pid at teardown.
"""

from __future__ import annotations

import json
import os
import subprocess
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from support.processes import ManagedProcess, free_port, wait_until
from support.tools import tool_path

START_TIMEOUT = 60.0


class PrometheusQueryError(RuntimeError):
    """The query API answered with an error (bad PromQL, or a server problem)."""


class Prometheus:
    """One prometheus server on 127.0.0.1 with a generated scrape config."""

    def __init__(
        self,
        workdir: Path,
        targets: Sequence[str],
        *,
        scrape_interval: str = "1s",
        rule_files: Sequence[Path] = (),
        job: str = "test",
        evaluation_interval: str = "1s",
    ) -> None:
        self.workdir = workdir
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.targets = list(targets)
        self.config_file = workdir / "prometheus.yml"
        config = {
            "global": {
                "scrape_interval": scrape_interval,
                "scrape_timeout": scrape_interval,
                "evaluation_interval": evaluation_interval,
            },
            "rule_files": [str(path) for path in rule_files],
            "scrape_configs": [{"job_name": job, "static_configs": [{"targets": self.targets}]}],
        }
        workdir.mkdir(parents=True, exist_ok=True)
        self.config_file.write_text(json.dumps(config, indent=2))  # JSON is valid YAML
        self.process = ManagedProcess(
            "prometheus",
            [
                tool_path("prometheus"),
                f"--config.file={self.config_file}",
                f"--storage.tsdb.path={workdir / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                "--web.enable-lifecycle",
                "--log.level=warn",
            ],
            workdir / "prometheus.log",
        )

    def start(self) -> None:
        """Start and wait for /-/ready."""
        self.process.start()
        wait_until(
            lambda: self._status("/-/ready") == 200, timeout=START_TIMEOUT, what="prometheus", process=self.process
        )

    def stop(self) -> None:
        """Stop by pid (idempotent)."""
        self.process.stop()

    def query(self, expr: str) -> list[dict[str, Any]]:
        """Evaluate an instant PromQL query; the result vector (``[{'metric': {...}, 'value': [ts, '1']}, ...]``)."""
        url = f"{self.url}/api/v1/query?{urllib.parse.urlencode({'query': expr})}"
        try:
            with urllib.request.urlopen(url, timeout=10) as response:
                body = json.load(response)
        except urllib.error.HTTPError as exc:
            body = json.load(exc)
        if body.get("status") != "success":
            raise PrometheusQueryError(f"{expr!r}: {body.get('errorType')}: {body.get('error')}")
        result: list[dict[str, Any]] = body["data"]["result"]
        return result

    def wait_for_series(self, expr: str, timeout: float = 30.0) -> list[dict[str, Any]]:
        """Poll ``query(expr)`` until it returns at least one series; fail with the target health if it never does."""
        found: list[dict[str, Any]] = []

        def has_series() -> bool:
            nonlocal found
            found = self.query(expr)
            return bool(found)

        try:
            wait_until(has_series, timeout=timeout, what=f"series for {expr!r}", process=self.process, interval=0.2)
        except TimeoutError as exc:
            raise TimeoutError(f"{exc}\ntargets: {json.dumps(self.targets_health())}") from None
        return found

    def targets_health(self) -> list[dict[str, Any]]:
        """The active targets with health and last error: the first thing to look at when a series is missing."""
        with urllib.request.urlopen(f"{self.url}/api/v1/targets", timeout=10) as response:
            active = json.load(response)["data"]["activeTargets"]
        return [{"url": t["scrapeUrl"], "health": t["health"], "error": t.get("lastError", "")} for t in active]

    def _status(self, path: str) -> int:
        try:
            with urllib.request.urlopen(self.url + path, timeout=2) as response:
                return int(response.status)
        except urllib.error.HTTPError as exc:
            return int(exc.code)
        except OSError:
            return 0


class Promtool:
    """The promtool that matches the prometheus binary: rule checks and rule unit tests."""

    def __init__(self) -> None:
        self.binary = tool_path("promtool")

    def run(self, *args: str | os.PathLike[str], check: bool = True) -> subprocess.CompletedProcess[str]:
        """Run promtool; raise CalledProcessError with its output when it fails and ``check`` is set."""
        argv = [str(self.binary), *(os.fspath(a) for a in args)]
        result = subprocess.run(argv, capture_output=True, text=True, timeout=120)
        if check and result.returncode != 0:
            raise subprocess.CalledProcessError(result.returncode, argv, result.stdout, result.stderr)
        return result

    def check_rules(self, *files: Path) -> subprocess.CompletedProcess[str]:
        """``promtool check rules``: syntax, PromQL and template validity."""
        return self.run("check", "rules", *files)

    def test_rules(self, *files: Path) -> subprocess.CompletedProcess[str]:
        """``promtool test rules``: alert/recording rule unit tests on synthetic series."""
        return self.run("test", "rules", *files)


PrometheusFactory = Callable[..., Prometheus]


@pytest.fixture(scope="session")
def prometheus_factory(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrometheusFactory]:
    """Start prometheus servers: ``prometheus_factory(["127.0.0.1:8000"], rule_files=[...])``; all stopped at end."""
    started: list[Prometheus] = []

    def start(targets: Sequence[str], **kwargs: Any) -> Prometheus:
        server = Prometheus(tmp_path_factory.mktemp("prometheus"), targets, **kwargs)
        started.append(server)
        server.start()
        return server

    try:
        yield start
    finally:
        for server in started:
            server.stop()


@pytest.fixture(scope="session")
def promtool() -> Promtool:
    """The pinned promtool (fails, never skips, when it is not installed)."""
    return Promtool()
