"""BENCHMARKS.md, rendered from the benchmarks' JSON results (``data/bench/<name>.json``).

Each benchmark writes its JSON; after every run the whole file is rendered again from all JSON
files present, with the command that produced each table, then the recorded one-off measurements.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agentflow_core.atomic import write_text

BENCH_DIR = Path("data/bench")
# One-off measurements (dated narratives, e.g. a removed fast path measured against its replacement):
# listed by title and path after the generated tables, so regenerating BENCHMARKS.md keeps pointing at them.
MEASUREMENTS_DIR = Path("docs/measurements")
BENCHMARKS_MD = Path("BENCHMARKS.md")
# agentflow bench forgetting --shift catalogue / family / recovery
FORGETTING = ("forgetting", "forgetting_family", "forgetting_recovery")

COMMANDS = {
    "pool": "agentflow bench pool",
    "ppo": "agentflow bench ppo",
    "scheduler": "agentflow bench scheduler",
    "train": "agentflow bench train",
    "learning": "agentflow bench learning",
    "sql": "agentflow bench sql",
    "soak": "agentflow bench soak",
    "soak_ray": "agentflow bench soak --backend ray",
    "browser": "agentflow bench browser",
    "oscar": "agentflow bench oscar",
    "offline": "agentflow bench offline",
    "validator": "agentflow bench validator",
    "forgetting": "agentflow bench forgetting",
    "forgetting_family": "agentflow bench forgetting",
    "forgetting_recovery": "agentflow bench forgetting",
    "tune": "agentflow bench tune",
    "onboarding": "agentflow bench onboarding",
    "transfer": "agentflow bench transfer",
    "transfer_refund": "agentflow bench transfer --params params-refund.yaml",
}
TITLES = {
    "pool": "Env pool: semantic overhead, Ray speed-up, memory, scheduler, recovery",
    "ppo": "PPO: throughput vs stable-baselines3, update time",
    "scheduler": "Scheduler strategies on a synthetic learner (1,000 variants, 100k draws)",
    "train": "End-to-end `agentflow train` on the Ray vs in-process backend, and a worker SIGKILL mid-train",
    "learning": (
        "Learning: AgentFlow vs sb3-contrib MaskablePPO from scratch and BC-warm-started, same logs, settings, reward "
        "and test split"
    ),
    "sql": "SQL channel: SQLite vs a real PostgreSQL server (embedded), the same expert episodes",
    "offline": "Offline stage: PPO's start and steps to the expert after BC vs after BC + CQL",
    "soak": "Soak: 300 live envs for a fixed time, clean vs 1% faulty variants of each kind (raise, sleep, spin, NaN)",
    "soak_ray": "Soak on the Ray backend: the same sides, env workers in Ray actors",
    "browser": "Web channel in a real browser: step latency, live envs per GB, sim-to-real gap per family",
    "oscar": "The checkout on a django-oscar store in Chromium: step and episode-reset latency",
    "validator": "Reward validator: planted reward-hacking episodes caught vs honest episodes flagged",
    "forgetting": "Forgetting: a retrain on a shifted catalogue, with and without EWC, on the previous test split",
    "forgetting_family": "Forgetting: a retrain on the SQL channel alone, with and without EWC, on the previous test split",
    "forgetting_recovery": "Forgetting: a retrain on failure-free variants, with and without EWC, on the previous test split",
    "tune": "Auto-tuner (impedance matching): `agentflow train` with its choice vs the static settings",
    "onboarding": "Onboarding: OpenAPI spec to a trainable env for the refund service; the refund process's expert",
    "transfer": "Cross-channel transfer: trained on all channels but one, played on the held-out channel's test split",
    "transfer_refund": "Cross-channel transfer, refund process: trained on one channel, played on the other's test split",
}


def fmt(value: Any) -> str:
    """A value as BENCHMARKS.md shows it (4 significant digits, yes/no, n/a)."""
    if value is None:
        return "n/a"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


# Targets from the issues, for keys a benchmark reports without its own verdict; (bound, higher is better).
KNOWN_TARGETS: dict[str, tuple[float, bool]] = {
    "sps_ratio_vs_sb3": (3.0, True),
    "update_s_2048": (0.1, False),
    "cold_share_vs_round_robin": (3.0, True),
    "max_visit_gap_over_n": (5.0, False),
    "draws_to_90pct_vs_round_robin": (1.0, False),
}


def _verdicts(result: dict[str, Any]) -> tuple[dict[str, Any], dict[str, bool]]:
    targets, met = dict(result.get("targets", {})), dict(result.get("targets_met", {}))
    runs = result.get("runs", {})
    for key, (bound, higher) in KNOWN_TARGETS.items():
        value = result.get(key)
        if isinstance(value, int | float) and key not in met:
            targets.setdefault(key, bound)
            values = runs.get(key, [value])  # repeated runs: met only if every run met it
            met[key] = all(v >= bound if higher else v <= bound for v in values)
    return targets, met


def _targets_table(result: dict[str, Any]) -> list[str]:
    targets, met = _verdicts(result)
    runs = result.get("runs", {})
    header = "| metric | value | target | met |"
    if runs:
        header += f" all {result.get('repeats', len(next(iter(runs.values()))))} runs |"
    lines = [header, "|---|---|---|---|" + ("---|" if runs else "")]
    rows = sorted(result.items(), key=lambda item: item[0] not in targets)  # metrics with a target first
    for key, value in rows:
        if isinstance(value, dict | list) or key in ("targets", "targets_met", "runs", "repeats", "command_options"):
            continue
        target = targets.get(key)
        line = (
            f"| `{key}` | {fmt(value)} | {'' if target is None else fmt(target)} | "
            f"{'' if key not in met else ('yes' if met[key] else '**no**')} |"
        )
        if runs:
            line += f" {' / '.join(fmt(v) for v in runs.get(key, []))} |"
        lines.append(line)
    return lines


def _scheduler_table(result: dict[str, Any]) -> list[str]:
    lines = [
        "| strategy | cold share | vs round-robin | longest gap / n | draws to 90% | vs round-robin |",
        "|---|---|---|---|---|---|",
    ]
    for name, m in result.get("strategies", {}).items():
        lines.append(
            f"| {name} | {m['cold_share']:.4f} | {fmt(m['cold_share_vs_round_robin'])} | "
            f"{m['max_visit_gap_over_n']:.2f} | {m['draws_to_90pct']} | {fmt(m['draws_to_90pct_vs_round_robin'])} |"
        )
    return lines


# The order of the sections in BENCHMARKS.md.
ORDER = (
    "learning",
    "train",
    "pool",
    "ppo",
    "scheduler",
    "sql",
    "offline",
    "validator",
    *FORGETTING,
    "soak",
    "soak_ray",
    "browser",
    "oscar",
    "tune",
    "onboarding",
    "transfer",
    "transfer_refund",
)


def _soak_options(result: dict[str, Any]) -> str:
    return (
        f" --seconds {result['seconds']:g} --isolation {result['step_isolation']}"
        f" --step-patience-s {result['step_patience_s'] or 0:g}"
        + (f" --patience-engages {result['step_patience_engages']}" if "step_patience_engages" in result else "")
    )


# The options each benchmark's result was produced with, as they follow its command.
OPTIONS: dict[str, Callable[[dict[str, Any]], str]] = {
    "train": lambda r: f" --total-steps {r['total_steps']}",
    "learning": lambda r: (
        f" --steps {r['config']['train']['total_steps']} --eval-every-updates {r['config']['eval_every_updates']}"
        f" --test-episodes {r['config']['test_episodes']}"
    ),
    "sql": lambda r: f" --episodes {r['episodes']}",
    "oscar": lambda r: f" --episodes {r['episodes']}",
    "browser": lambda r: (
        f" --episodes {r['latency_episodes']} --live-envs {r['live_envs']} --gap-episodes {r['gap_episodes_per_family']}"
    ),
    "offline": lambda r: (
        f" --steps {r['config']['ppo_total_steps']} --settings "
        + ",".join(f"{v['behaviour']}:{v['explore_steps']}" for v in r["settings"].values())
    ),
    "validator": lambda r: f" --episodes {r['episodes_per_policy']} --train-steps {r['train_steps']}",
    **{
        name: lambda r: f" --steps {r['total_steps_cap']} --shift {r.get('shift_name', 'catalogue')}"
        for name in FORGETTING
    },
    "tune": lambda r: (
        f" --total-steps {r['total_steps']} --cluster-cpus {r['cluster_cpus']}"
        f" --cluster-workers {r['cluster_static_workers']} --rounds {r['rounds']}"
    ),
    "soak": _soak_options,
    "soak_ray": _soak_options,
}


def _section(name: str, path: Path) -> list[str]:
    """One benchmark's section: title, the command that produced it, its table, notes and plot."""
    result = json.loads(path.read_text())
    command = COMMANDS[name] + (f" --repeat {result['repeats']}" if result.get("repeats", 1) > 1 else "")
    command += OPTIONS[name](result) if name in OPTIONS else ""
    command += result.get("command_options", "")  # a benchmark that records its own options
    if name in ("soak", "soak_ray"):  # its runs are the clean/faulty/clean sides, not repeats; its verdicts are "met"
        result = {k: v for k, v in result.items() if k not in ("runs", "met")} | {"targets_met": result["met"]}
    out = [f"## {TITLES[name]}", "", f"Command: `{command}` → `{path}`", ""]
    out += _scheduler_table(result) if name == "scheduler" else _targets_table(result)
    if result.get("notes"):
        out += ["", *[f"- {note}" for note in result["notes"]]]
    if result.get("plot"):
        out += ["", f"![learning curves]({result['plot']})"]
    return [*out, ""]


def render_benchmarks(bench_dir: Path = BENCH_DIR, measurements_dir: Path = MEASUREMENTS_DIR) -> str:
    """BENCHMARKS.md from every ``data/bench/<name>.json``, then the recorded one-off measurements."""
    out = [
        "# Benchmarks",
        "",
        "Measured on this project's reference machine (2 cores, 24 GiB, no GPU, Python 3.11). Each side of",
        "every ratio is measured in the same run. With `--repeat N` the value column is the last run, the",
        "last column every run, and a target counts as met only if all runs met it. Regenerate with the",
        "command above each table (`agentflow bench all --repeat 3` runs them all).",
        "",
        "The learning benchmark trains the shipped process (`params.yaml`: checkout_v2, where the rules fall",
        "short of an oracle). The channel, pool, browser, store and training-machinery benchmarks measure a",
        "fixed reference workload by default, the first checkout world's three channels written in Python",
        "(`params-checkout.yaml`), so their figures stay comparable; `--params` names another.",
        "",
    ]
    for name in ORDER:
        path = bench_dir / f"{name}.json"
        if path.exists():
            out += _section(name, path)
    notes = sorted(measurements_dir.glob("*.md"))
    if notes:
        out += ["## One-off measurements", ""]
        out += [f"- {_note_title(note)}: `{note.as_posix()}`" for note in notes]
        out.append("")
    return "\n".join(out)


def _note_title(note: Path) -> str:
    """The first heading of a measurement note, without its ``#`` marks (the file name if it has none)."""
    lines = note.read_text(encoding="utf-8").splitlines()
    return next((line.lstrip("#").strip() for line in lines if line.startswith("#")), note.stem)


def bench_section(title: str) -> str:
    """The section of the rendered BENCHMARKS.md under ``## title``."""
    return next((part for part in render_benchmarks().split("## ") if part.startswith(title)), "")


def write_benchmarks_md(bench_dir: Path = BENCH_DIR, target: Path = BENCHMARKS_MD) -> None:
    """Re-render BENCHMARKS.md after a benchmark, so the committed table follows the JSON results."""
    write_text(target, render_benchmarks(bench_dir))
