"""Fill docs/reliability.md's figures from the reliability suite's own JSON output (reports/chaos/*.json).

    .venv/bin/python scripts/reliability_report.py [--reports reports/chaos] [--doc docs/reliability.md] [--check]

Everything between the ``<!-- reliability-report:begin -->`` and ``<!-- reliability-report:end -->`` markers is
generated; the rest of the document is prose. ``--check`` exits 1 if the document differs from what the reports give.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

BEGIN = "<!-- reliability-report:begin -->"
END = "<!-- reliability-report:end -->"
ROOT = Path(__file__).resolve().parents[1]
FAULT_ORDER = [
    "shard_kill",
    "shard_hang",
    "shard_slow",
    "error_burst_5xx",
    "rate_limit_429",
    "connection_drop",
    "wrong_model",
    "env_crash",
    "all_shards_down",
]


def load(directory: Path) -> dict[str, dict[str, Any]]:
    reports = {}
    for path in sorted(directory.glob("*.json")):
        data = json.loads(path.read_text())
        reports[str(data.get("scenario", path.stem))] = data
    return reports


def _table(header: list[str], rows: list[list[Any]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join("---" for _ in header) + " |"]
    lines += ["| " + " | ".join("" if cell is None else str(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def _mean(values: list[float]) -> str:
    return f"{sum(values) / len(values):.2f}" if values else "n/a"


def render(reports: dict[str, dict[str, Any]]) -> str:
    chaos = [r for name, r in sorted(reports.items()) if "fault_costs" in r]
    out: list[str] = []

    prompts = sum(r["prompts"] for r in chaos)
    controlplane = reports.get("controlplane")
    cp_prompts = controlplane["prompts"] if controlplane else 0
    lost = sum(r["lost"] for r in chaos) + (controlplane["lost"] if controlplane else 0)
    violations = sum(len(r["invariant_violations"]) for r in chaos)
    faults = Counter[str]()
    for r in chaos:
        faults.update(r["faults_injected"])
    cp_faults = len(controlplane["timeline"]) if controlplane else 0
    out.append("### Summary\n")
    out.append(
        _table(
            ["figure", "value"],
            [
                ["chaos scenarios run (seeded process faults)", len(chaos)],
                ["control-plane scenarios run", 1 if controlplane else 0],
                ["prompts driven", prompts + cp_prompts],
                [
                    "prompts completed",
                    sum(r["completed"] for r in chaos) + (controlplane["completed"] if controlplane else 0),
                ],
                [
                    "prompts data-failed, with their reason (over-long or unparseable by design)",
                    sum(r["data_failed"] for r in chaos),
                ],
                [
                    "prompts aborted by a run that raised loudly (the fleet-gone scenario)",
                    sum(r["aborted"] for r in chaos),
                ],
                ["**prompts lost**", f"**{lost}**"],
                ["invariant violations", violations],
                [
                    "leaked tasks / sockets",
                    f"{sum(r['leaked_tasks'] for r in chaos)} / {sum(r['leaked_sockets'] for r in chaos)}",
                ],
                ["process faults injected", sum(faults.values())],
                ["control-plane faults injected", cp_faults],
            ],
        )
    )

    out.append("\n### Faults injected, by kind\n")
    out.append(_table(["fault", "injected"], [[kind, faults.get(kind, 0)] for kind in FAULT_ORDER]))

    sums: dict[str, Counter[str]] = defaultdict(Counter)
    extra: dict[str, list[float]] = defaultdict(list)
    injected = Counter[str]()
    runs = [r for r in chaos if not r.get("run_error")]  # the fleet-gone scenario's cost is the run itself
    for r in runs:
        injected.update(r["faults_injected"])
        for kind, cost in r["fault_costs"].items():
            sums[kind].update({key: cost[key] for key in ("failed_attempts", "redispatches", "affected_prompts")})
            sums[kind]["attempt_seconds"] += cost["failed_attempt_mean_seconds"] * cost["failed_attempts"]
            if cost["extra_latency_mean_seconds"] is not None:
                extra[kind].append(cost["extra_latency_mean_seconds"])
    out.append(
        f"\n### What each fault costs (per injected fault, over {len(runs)} seeded runs; "
        "data and unattributed: per run)\n"
    )
    rows = []
    for kind in [*FAULT_ORDER, "unattributed", "data"]:
        count = injected.get(kind, 0) if kind in FAULT_ORDER else len(runs)
        if not count or (kind not in FAULT_ORDER and kind not in sums):
            continue
        c = sums[kind]
        failed = c["failed_attempts"]
        rows.append(
            [
                kind,
                f"{failed / count:.1f}",
                f"{c['redispatches'] / count:.1f}",
                f"{c['affected_prompts'] / count:.1f}",
                f"{c['attempt_seconds'] / failed:.2f}" if failed else "-",
                _mean(extra[kind]) if extra[kind] else "-",
            ]
        )
    out.append(
        _table(
            [
                "charged to",
                "failed attempts",
                "redispatches",
                "prompts affected",
                "s lost per failed attempt",
                "extra end-to-end s per affected prompt",
            ],
            rows,
        )
    )

    out.append("\n### Scenarios\n")
    out.append(
        _table(
            [
                "scenario",
                "seed",
                "prompts",
                "completed",
                "data-failed",
                "aborted",
                "lost",
                "faults",
                "redispatches",
                "ejections",
                "resumed from checkpoint",
                "run error",
                "seconds",
            ],
            [
                [
                    r["scenario"],
                    r["seed"],
                    r["prompts"],
                    r["completed"],
                    r["data_failed"],
                    r["aborted"],
                    r["lost"],
                    sum(r["faults_injected"].values()),
                    r["redispatches"],
                    r["ejections"],
                    f"{r['resumed_from_checkpoint']}/{r['checkpointed_episodes']}",
                    (r["run_error"] or "").split(":", 1)[0] or "-",
                    r["seconds"],
                ]
                for r in chaos
            ],
        )
    )

    if controlplane:
        out.append(
            f"\n### Control plane (real kube-apiserver + etcd; {controlplane['prompts']} prompts, "
            f"{controlplane['completed']} completed, {controlplane['lost']} lost; the source re-listed "
            f"{controlplane['relists']} times)\n"
        )
        out.append(
            _table(
                ["fault", "control-plane action s", "killed shard left the trainer's view s", "restarted shard back s"],
                [
                    [
                        t["fault"],
                        t.get("control_plane_action_seconds", "-"),
                        t.get("shard_left_view_seconds", "-"),
                        t.get("shard_back_in_view_seconds", "-"),
                    ]
                    for t in controlplane["timeline"]
                ],
            )
        )

    out.append("\n### Bad input and least privilege\n")
    rows = []
    bad = reports.get("bad-input")
    if bad:
        rows.append(["invalid custom resources sent to the API server", bad["tried"], f"{bad['rejected']} rejected"])
    for name, label in (
        ("fuzz-failures", "failure classification: exceptions, chains, groups, hostile objects"),
        ("fuzz-redaction", "credential redaction: planted secrets in arbitrary text"),
        ("fuzz-probe", "prober against a real server: fuzzed statuses/headers/bodies and raw garbage"),
        ("fuzz-environment", "environment server request parsing over HTTP"),
        ("security-probe-targets", "SSRF probe targets through the real prober and resolver"),
    ):
        if name in reports:
            rows.append([label, reports[name]["cases"], "0 failures"])
    rbac = reports.get("rbac")
    if rbac:
        for identity in ("operator", "trainer"):
            if identity in rbac:
                rows.append([f"forbidden API requests by the {identity}'s token", rbac[identity]["refused"], "all 403"])
    out.append(_table(["input", "cases", "result"], rows))
    return "\n".join(out) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reports", type=Path, default=ROOT / "reports" / "chaos")
    parser.add_argument("--doc", type=Path, default=ROOT / "docs" / "reliability.md")
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args()
    reports = load(args.reports)
    if not reports:
        print(f"no reports in {args.reports}: run the reliability suite first (see docs/reliability.md)")
        return 1
    text = args.doc.read_text()
    head, _, rest = text.partition(BEGIN)
    _, _, tail = rest.partition(END)
    updated = f"{head}{BEGIN}\n{render(reports)}{END}{tail}"
    if args.check:
        return 0 if updated == text else 1
    args.doc.write_text(updated)
    print(f"wrote {args.doc} from {len(reports)} report(s) in {args.reports}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
