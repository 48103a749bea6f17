"""The evaluation report (docs/design.md §4.3): one JSON document, rendered three ways.

:func:`build_report` assembles the document from a stress analysis (``StressAnalysis.to_dict()``)
and, optionally, a champion/challenger decision. Its top-level keys are ``REPORT_KEYS``.
:func:`report_tree` gives the design's report tree (rendered as text by :func:`tree_text`, or by the CLI
with rich); :mod:`agentflow_core.evaluation.report_render` renders the document as Markdown and as
a standalone HTML page from the tree and the tables built here. Rendering is pure: file I/O stays at the edge.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from agentflow_core.evaluation.report_oscar import FINETUNE_COLUMNS, finetune_rows, oscar_labels, oscar_rows
from agentflow_core.evaluation.value import value_tables

SCHEMA_VERSION = 1
REPORT_KEYS: tuple[str, ...] = (
    "schema_version",
    "policy",
    "process",
    "goal",
    "checkpoint",
    "created_at",
    "passed",
    "metrics",
    "by_family",
    "process_success",
    "goal_success",
    "coverage",
    "consistency",
    "root_causes",
    "reward_hacking",
    "reward_validator",
    "risk",
    "recommendation",
    "recommendations",
    "plots",
    "champion",
    "cycle",
    "sim_to_real",
    "sim_to_real_oscar",
)


@dataclass(frozen=True)
class TreeNode:
    """One line of the report tree and its children."""

    label: str
    children: list[TreeNode] = field(default_factory=list)


def build_report(
    analysis: Mapping[str, Any],
    policy: str,
    checkpoint: str | None,
    created_at: str,
    plots: Mapping[str, str] | None = None,
    champion: Mapping[str, Any] | None = None,
    cycle: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The report document; ``plots`` maps a plot name to its file name next to the report.

    ``cycle`` (:func:`cycle_context`'s shape: verdict, date, commit, links, training, gates, budgets,
    quarantine) is what the report opens with; without it the report is the stress detail alone.
    """
    recs = list(analysis.get("recommendations", []))
    return {
        "schema_version": SCHEMA_VERSION,
        "policy": policy,
        "process": analysis.get("process"),
        "goal": analysis.get("goal"),
        "checkpoint": checkpoint,
        "created_at": created_at,
        "passed": bool(analysis["passed"]),
        "metrics": dict(analysis["metrics"]),
        "by_family": analysis.get("by_family", {}),
        "process_success": analysis.get("process_success"),
        "goal_success": analysis.get("goal_success"),
        "coverage": analysis["coverage"],
        "consistency": analysis["consistency"],
        "root_causes": analysis["root_causes"],
        "reward_hacking": analysis["reward_hacking"],
        "reward_validator": analysis.get("reward_validator"),
        "risk": analysis["risk"],
        "recommendation": recs[0] if recs else "",
        "recommendations": recs,
        "plots": dict(plots or {}),
        "champion": dict(champion) if champion is not None else None,
        "cycle": dict(cycle) if cycle is not None else None,
        "sim_to_real": analysis.get("sim_to_real"),
        "sim_to_real_oscar": analysis.get("sim_to_real_oscar"),
    }


def verdict(stress_passed: bool, stress_gate: str, champion: Mapping[str, Any] | None) -> dict[str, str]:
    """``promoted`` / ``kept`` / ``gate failed`` (or ``not compared`` without a champion/challenger run), and why."""
    if not stress_passed:
        return {"verdict": "gate failed", "reason": stress_gate}
    if champion is None:
        return {"verdict": "not compared", "reason": "stress gate passed; no champion/challenger comparison was run"}
    return {"verdict": "promoted" if champion["promote"] else "kept", "reason": str(champion["reason"])}


def cycle_context(
    verdict_: Mapping[str, str],
    created_at: str,
    commit: str,
    links: Mapping[str, str],
    training: Mapping[str, Any] | None,
    gates: Sequence[Mapping[str, Any]],
    budgets: Sequence[Mapping[str, Any]],
    quarantine: Sequence[Mapping[str, Any]],
) -> dict[str, Any]:
    """What the report opens with, as plain data (assembled at the edge from the cycle's outputs)."""
    return {
        **dict(verdict_),
        "created_at": created_at,
        "commit": commit,
        "links": dict(links),
        "training": dict(training) if training is not None else None,
        "gates": [dict(g) for g in gates],
        "budgets": [dict(b) for b in budgets],
        "quarantine": [dict(q) for q in quarantine],
    }


def headline_tables(report: Mapping[str, Any]) -> list[tuple[str, list[str], list[list[Any]]]]:
    """The tables the report opens with: policies compared, gates, budgets, quarantine (shared by md and HTML)."""
    cycle = report.get("cycle") or {}
    out: list[tuple[str, list[str], list[list[Any]]]] = []
    train = cycle.get("training")
    if train and train.get("value"):  # a process that prices its episodes: value vs rules vs oracle leads
        out += value_tables(train["value"])
    if train:
        rows = [
            [
                "trained policy (best checkpoint)",
                _pct(train["test_process_success"]),
                _pct(train["test_goal_success"]),
            ],
            ["rules", _pct(train["test_process_success_rules"]), _pct(train["test_goal_success_rules"])],
            [
                "exploration policy",
                _pct(train["test_process_success_exploration"]),
                _pct(train["test_goal_success_exploration"]),
            ],
        ]
        headers = ["policy", "process success", _goal_success(report)]
        out.append(("Test split: trained vs the process's rules", headers, rows))
    if train and train.get("tuning"):
        out += _tuning_tables(train)
    champ = report.get("champion")
    if champ and champ.get("champion_stats"):
        ch, cp = champ["challenger_stats"], champ["champion_stats"]
        rows = [
            ["challenger", f"{ch['mean_evaluated_return']:.3f}", _pct(ch["success_rate"])],
            ["champion", f"{cp['mean_evaluated_return']:.3f}", _pct(cp["success_rate"])],
        ]
        out.append(("Champion slice: challenger vs champion", ["policy", "mean evaluated return", "success"], rows))
    gates = [[g["phase"], g["enforced"], g["outcome"]] for g in cycle.get("gates", [])]
    out.append(("Gates", ["phase", "enforced", "outcome"], gates))
    budgets = [
        [
            b["phase"],
            f"{b['wall_s']:.1f} / {b['budget_s']:g} s",
            f"{b['steps']} / {b['budget_steps']}" if b.get("steps") is not None else "",
            "yes" if b["within"] else "OVER",
        ]
        for b in cycle.get("budgets", [])
    ]
    out.append(("Budgets: used / allotted", ["phase", "wall clock", "env steps", "within"], budgets))
    quarantine = [[q["env_id"], q["family"], q["reason"]] for q in cycle.get("quarantine", [])]
    out.append(
        ("Quarantined by calibration (left out of every later phase)", ["env_id", "family", "reason"], quarantine)
    )
    return out


def _tuning_tables(train: Mapping[str, Any]) -> list[tuple[str, list[str], list[list[Any]]]]:
    """The auto-tuner's choice (each knob: static, chosen, why) and the loop's measured impedance."""
    tuning = train["tuning"]
    if tuning.get("applied"):
        rows = [[d["knob"], d["shipped"], d["value"], d["reason"]] for d in train.get("tuning_decisions", [])]
    else:
        rows = [["(all)", "static", "static", tuning.get("reason", "")]]
    out = [("Auto-tuner: settings train ran with (docs/design.md §7.1)", ["knob", "static", "chosen", "why"], rows)]
    impedance = train.get("impedance") or {}
    if impedance:
        measured = [[k.removeprefix("impedance/"), f"{v:.4g}"] for k, v in sorted(impedance.items())]
        out.append(("Impedance: measured per update (mean over the cycle)", ["measure", "value"], measured))
    return out


def opening_lines(report: Mapping[str, Any]) -> list[str]:
    """Verdict, date, commit and links as plain lines (markdown-safe)."""
    cycle = report.get("cycle")
    if not cycle:
        return []
    lines = [f"Verdict: {cycle['verdict'].upper()} — {cycle['reason']}", f"Date: {cycle['created_at']}"]
    lines.append(f"Commit: {cycle['commit']}")
    lines += [f"{name}: {url}" for name, url in cycle["links"].items()]
    train = cycle.get("training")
    if train:
        lines.append(
            f"Training: stopped on {train['stop_reason']} after {train['global_step']} env steps "
            f"({train['updates']} updates; policy_convergence_flag={train['policy_convergence_flag']})"
        )
    return lines


def _goal_success(report: Mapping[str, Any]) -> str:
    """The goal-success column's name: it names the process's goal token (metrics keep the key goal_success)."""
    goal = report.get("goal")
    return f"goal success ({goal})" if goal else "goal success"


def _mark(ok: bool) -> str:
    return "✓" if ok else "✗"


def report_tree(report: Mapping[str, Any]) -> TreeNode:
    """The report tree of docs/design.md §4.3: coverage, consistency, root causes, hacking, risk, champion, recommendation."""
    m, cons, cov = report["metrics"], report["consistency"], report["coverage"]
    target = cons["target"]
    rare = ", ".join((cov["long_tail"] + cov["unseen"])[:5]) or "none"
    causes = report["root_causes"]
    cause_nodes = [TreeNode(c["summary"]) for c in causes["top"]] or [TreeNode("no failed episodes")]
    risk = report["risk"]
    top_risky = next(iter(risk["by_action"]), None)
    nodes = [
        TreeNode(
            f"Robustness: {m['robustness_score']:.3f} = success {m['success_rate']:.1%} × consistency "
            f"{m['consistency']:.1%} × (1 − crash {m['crash_rate']:.1%}) {_mark(bool(report['passed']))}"
        ),
        TreeNode(
            f"Episodes: {m['episodes']} on {m['variants']} test-split variants; process success "
            f"{_with_ci(report.get('process_success'), m['success_rate'])}, {_goal_success(report)} "
            f"{_with_ci(report.get('goal_success'), m['goal_success_rate'])}, "
            f"mean evaluated return {m['mean_evaluated_return']:.2f}, crash episodes {m['crash_episodes']}"
        ),
        TreeNode(f"State Coverage: {cov['state_coverage']:.1%} of reachable tokens (long tail / unseen: {rare})"),
        TreeNode(
            f"Policy Consistency: {m['consistency']:.1%} (target ≥{target:.0%} {_mark(m['consistency'] >= target)}; "
            f"a random policy {m['consistency_random']:.1%} on the same probes) over {m['consistency_variants']} "
            f"variants; matched states {m['matched_state_consistency']:.1%}" + _cross_channel(m)
        ),
        TreeNode(f"Failure Root Causes ({causes['failures']} failed of {m['episodes']}):", cause_nodes),
        TreeNode(
            f"Reward Hacking: {report['reward_hacking']['flagged']} episode(s) with shaped return ≥ "
            f"{report['reward_hacking']['threshold']:g} and neither {report.get('goal') or 'the goal'} nor a handled ending"
        ),
        *_validator_nodes(report.get("reward_validator")),
        TreeNode(
            f"Risk: {risk['risky_steps']} risky step(s) ({risk['rate']:.2%}) in {risk['risky_episodes']} episode(s)"
            + (f", mostly {top_risky}" if top_risky else "")
            + f"; penalty {risk['total_penalty']:g}"
        ),
    ]
    real = report.get("sim_to_real")
    if real:
        nodes.append(
            TreeNode(
                f"Sim-to-Real: largest gap {100 * real['max_gap']:+.1f} pts of process success",
                [
                    TreeNode(
                        f"{f['family']} on {f['real_channel']}: sim {f['sim_process_success']:.1%}, "
                        f"real {f['real_process_success']:.1%} over {f['episodes']} paired episodes, "
                        f"{f['identical_fraction']:.0%} on the same path"
                    )
                    for f in real["families"]
                ],
            )
        )
    nodes.extend(_oscar_nodes(report.get("sim_to_real_oscar")))
    if report.get("champion"):
        nodes.append(
            TreeNode(
                f"Champion/Challenger: {'promote' if report['champion']['promote'] else 'keep champion'} — "
                f"{report['champion']['reason']}"
            )
        )
    nodes.append(TreeNode(f"Recommendation: {report['recommendation']}"))
    return TreeNode(f"📊 Evaluation Report for {report['policy']}", nodes)


def tree_text(node: TreeNode) -> list[str]:
    """Box-drawing lines of a tree, the root first."""
    return [node.label, *_branch_lines(node, "")]


def _branch_lines(node: TreeNode, prefix: str) -> list[str]:
    lines = []
    for i, child in enumerate(node.children):
        last = i == len(node.children) - 1
        lines.append(f"{prefix}{'└── ' if last else '├── '}{child.label}")
        lines.extend(_branch_lines(child, prefix + ("    " if last else "│   ")))
    return lines


def _pct(x: float) -> str:
    return "n/a" if x != x else f"{x:.1%}"


def _with_ci(breakdown: Mapping[str, Any] | None, rate: float) -> str:
    """``rate`` with its 95% Wilson interval when the breakdown carries one."""
    if not breakdown:
        return f"{rate:.1%}"
    low, high = breakdown["ci95"]
    return f"{breakdown['rate']:.1%} [{low:.1%}, {high:.1%}]"


def _strata_rows(report: Mapping[str, Any]) -> list[list[Any]]:
    """Per family and per dimension value: episodes, process and goal success with 95% Wilson intervals."""
    process, goal = report.get("process_success"), report.get("goal_success")
    if not process or not goal:
        return []
    cells = [(f"family {k}", v, goal["by_family"][k]) for k, v in process["by_family"].items()]
    cells += [
        (f"{dim} {value}", v, goal["by_dimension"][dim][value])
        for dim, values in process["by_dimension"].items()
        for value, v in values.items()
    ]
    return [[name, proc["n"], _with_ci(proc, proc["rate"]), _with_ci(pay, pay["rate"])] for name, proc, pay in cells]


def section_tables(report: Mapping[str, Any]) -> list[tuple[str, list[str], list[list[Any]]]]:
    """(title, headers, rows) of the report's tables, shared by markdown and HTML."""
    m = report["metrics"]
    metrics = [[k, f"{v:.4g}" if isinstance(v, float) else v] for k, v in m.items()]
    fams = [
        [f, d["episodes"], _pct(d["success_rate"]), f"{d['mean_evaluated_return']:.2f}", d["crash_episodes"]]
        for f, d in report["by_family"].items()
    ]
    causes = [
        [c["cause"], c["count"], _pct(c["share"]), c["summary"], c["recommendation"]]
        for c in report["root_causes"]["top"]
    ]
    worst = report["consistency"]["per_variant"]
    variants = [
        [
            r["env_id"],
            r["family"],
            _pct(r["agreement"]),
            _pct(r["success_rate"]),
            r["episodes"],
            "yes" if r["consistent_but_bad"] else "",
        ]
        for r in sorted(worst, key=lambda r: r["agreement"])[:10]
    ]
    matched = [
        [" ".join(r["tokens"]), r["variants"], _pct(r["agreement"]), r["actions"]]
        for r in report["consistency"]["matched_states"]["least_consistent_states"]
    ]
    risk = report["risk"]
    risk_rows = [[f"action {k}", v["risky"], v["steps"], _pct(v["rate"])] for k, v in risk["by_action"].items()]
    risk_rows += [[f"family {k}", v["risky"], v["steps"], _pct(v["rate"])] for k, v in risk["by_family"].items()]
    hack = [
        [e["episode_id"], e["env_id"], e["shaped_return"], e["env_return"], " → ".join(e["path"][-4:])]
        for e in report["reward_hacking"]["examples"]
    ]
    sim_to_real = sim_to_real_rows(report)
    return [
        ("Metrics", ["metric", "value"], metrics),
        (
            "Sim-to-real gap (same variants and seeds on the real channels)",
            [
                "family",
                "real channel",
                "episodes",
                "sim success",
                "real success",
                "gap",
                "same path",
                "real step ms p50 / p95",
            ],
            sim_to_real,
        ),
        (
            "Sim-to-real by dimension value",
            ["dimension", "value", "episodes", "sim success", "real success", "gap", "root causes on the real side"],
            oscar_rows(report, "sim_to_real"),
        ),
        (
            "Sim-to-real on the django-oscar store, by dimension value",
            ["dimension", "value", "episodes", "sim success", "oscar success", "gap", "root causes on Oscar"],
            oscar_rows(report),
        ),
        (
            "Fine-tuning on the django-oscar store (agentflow train --channel oscar): the same episodes before and after",
            FINETUNE_COLUMNS,
            finetune_rows(report),
        ),
        ("By family", ["family", "episodes", "success", "mean evaluated return", "crashes"], fams),
        (
            "Success by family and dimension value (95% Wilson interval)",
            ["stratum", "episodes", "process success", _goal_success(report)],
            _strata_rows(report),
        ),
        ("Failure root causes", ["cause", "episodes", "share", "summary", "recommendation"], causes),
        (
            "Least consistent probed variants",
            ["env_id", "family", "agreement", "success", "episodes", "consistent but bad"],
            variants,
        ),
        ("Least consistent matched states", ["tokens", "variants", "agreement", "modal actions"], matched),
        ("Risk", ["group", "risky steps", "steps", "rate"], risk_rows),
        ("Reward hacking examples", ["episode", "env_id", "shaped return", "env return", "path (last)"], hack),
    ]


def sim_to_real_rows(report: Mapping[str, Any]) -> list[list[Any]]:
    """One row per family of the sim-to-real run (none when it did not run)."""
    return [
        [
            f["family"],
            f["real_channel"],
            f["episodes"],
            _pct(f["sim_process_success"]),
            _pct(f["real_process_success"]),
            f"{100 * f['gap']:+.1f} pts",
            _pct(f["identical_fraction"]),
            f"{f['real_step_ms_p50']:.1f} / {f['real_step_ms_p95']:.1f}",
        ]
        for f in (report.get("sim_to_real") or {}).get("families", [])
    ]


def _oscar_nodes(oscar: Mapping[str, Any] | None) -> list[TreeNode]:
    """The django-oscar line of the tree: success on the store, in the simulator, the gap, per dimension value."""
    return [TreeNode(label, [TreeNode(c) for c in children]) for label, children in oscar_labels(oscar)]


def _validator_nodes(validator: Mapping[str, Any] | None) -> list[TreeNode]:
    """The discriminator reward validator's line (none when it is off or was not trained)."""
    if not validator:
        return []
    examples = [TreeNode(f"{e['env_id']}: authenticity {e['authenticity']:.2f}") for e in validator["examples"]]
    return [
        TreeNode(
            f"Reward Validator: {validator['flagged']} suspicious episode(s) ({validator['rate']:.1%}) with mean "
            f"discriminator authenticity < {validator['threshold']:g} (mean {validator['mean_authenticity']:.2f})",
            examples,
        )
    ]


def _cross_channel(m: Mapping[str, Any]) -> str:
    """The cross-channel clause of the consistency line (absent in reports written before it existed)."""
    value = m.get("cross_channel_consistency")
    if value is None or value != value:  # missing or NaN (fewer than two channels)
        return ""
    return (
        f"; across channels {value:.1%} on {int(m['cross_channel_paired_states'])} paired states "
        f"(random {m['cross_channel_consistency_random']:.1%})"
    )
