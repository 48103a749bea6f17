"""Report step: the evaluation report (md / html / json + PNGs) and the champion/challenger canary.

``run_report`` renders ``data/reports/`` (atomically, as one directory) from the stress summary
of the same checkpoint, running the stress phase first when ``data/stress/summary.json`` is
missing or belongs to another policy. ``run_champion_challenger`` evaluates a challenger against
the champion on a stable ``report.champion_slice`` of the catalogue and returns the decision of
``agentflow_core.evaluation.champion.decide_promotion``; the MLflow alias is moved by the caller
(``tasks/tracking.py``), not here.
"""

from __future__ import annotations

import datetime as _dt
import json
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from agentflow_core.atomic import atomic_dir, check_output, write_json
from agentflow_core.config import AgentFlowConfig
from agentflow_core.errors import AgentFlowError
from agentflow_core.evaluation.champion import champion_slice, decide_promotion
from agentflow_core.evaluation.consistency import (
    DEFAULT_CART_SCALE,
    canonical_consistency,
    policy_agreement,
    probe_observation,
)
from agentflow_core.evaluation.paired import paired_by_key
from agentflow_core.evaluation.records import PolicyFn
from agentflow_core.evaluation.report import (
    build_report,
    cycle_context,
    report_tree,
    tree_text,
    verdict,
)
from agentflow_core.evaluation.report_render import render_html, render_markdown
from agentflow_core.evaluation.robustness import consistency_variants
from agentflow_core.evaluation.stress import StressRollout
from agentflow_core.gates import declared_gates, evaluate_gate
from agentflow_core.variants import VariantSpec
from tasks.budgets import read_budgets
from tasks.compose import PoolFactory, build_pool
from tasks.context import PhaseContext
from tasks.plots import write_plots
from tasks.provenance import GIT_COMMIT_TAG, git_tags
from tasks.rollout import LoadedPolicy, cart_scales, load_policy, load_variants, resolve_checkpoint, stress_rollout
from tasks.steps.calibrate import read_quarantine


def load_stress_summary(stress_dir: Path) -> dict[str, Any] | None:
    """``summary.json`` of a stress run, or None when there is none."""
    path = stress_dir / "summary.json"
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None


TRAIN_CURVE = "train_curves.png"


def with_oscar_finetune(summary: dict[str, Any], finetune_file: Path, checkpoint: str) -> dict[str, Any]:
    """The stress summary with the Oscar fine-tune's before/after (``agentflow train --channel oscar``) added
    under ``sim_to_real_oscar.finetune`` when one exists for this checkpoint and the Oscar run is in it."""
    oscar = summary.get("sim_to_real_oscar")
    if not oscar or not oscar.get("episodes") or not finetune_file.is_file():
        return summary
    finetune = json.loads(finetune_file.read_text(encoding="utf-8"))
    if finetune.get("champion", {}).get("checkpoint") != checkpoint:
        return summary  # a fine-tune of another policy: not this report's
    return {**summary, "sim_to_real_oscar": {**oscar, "finetune": finetune}}


def gate_rows(cfg: AgentFlowConfig, metrics_dir: Path) -> list[dict[str, Any]]:
    """Every declared gate with what it enforces and its outcome, judged on the phases' metrics files."""
    rows = []
    for gate in declared_gates(cfg):
        path = metrics_dir / f"{gate.phase}.json"
        if path.exists():
            outcome = evaluate_gate(gate, json.loads(path.read_text(encoding="utf-8"))).message
        else:
            outcome = "not run"
        rows.append({"phase": gate.phase, "enforced": gate.describe(), "outcome": outcome})
    return rows


def training_summary(checkpoints: Path) -> dict[str, Any] | None:
    """The headline of ``train_summary.json`` (test split: trained vs expert vs exploration; why it stopped)."""
    path = checkpoints / "train_summary.json"
    if not path.exists():
        return None
    t = json.loads(path.read_text(encoding="utf-8"))
    keys = (
        "test_process_success",
        "test_goal_success",
        "test_process_success_rules",
        "test_goal_success_rules",
        "test_process_success_exploration",
        "test_goal_success_exploration",
        "policy_convergence_flag",
        "global_step",
        "updates",
    )
    out = {**{k: t[k] for k in keys}, "stop_reason": t.get("stop_reason", "step_budget")}
    out.update(value_summary(t))
    if "tuning" in t:  # the auto-tuner's record and the loop's measured impedance (tasks.steps.tune)
        out.update(tuning=t["tuning"], impedance=t.get("impedance", {}))
    return out


def value_summary(train: Mapping[str, Any]) -> dict[str, Any]:
    """The test split's business value per policy (``value``: each one's breakdown) and the headline value
    metrics, when the process prices its episodes; nothing otherwise."""
    sources = {"trained": "test", "rules": "test_rules", "oracle": "test_oracle", "bc": "test_bc"}
    sources["offline"] = "test_offline"
    value = {
        name: train[key]["business_value"]
        for name, key in sources.items()
        if "business_value" in (train.get(key) or {})
    }
    if "trained" not in value:
        return {}
    headline = {k: v for k, v in train.items() if k.startswith(("test_business_value", "test_regret_closed"))}
    return {"value": value, **headline, "mean_episode_steps": train.get("mean_episode_steps")}


def build_cycle(
    ctx: PhaseContext, stress: Mapping[str, Any], champion: Mapping[str, Any] | None, links: Mapping[str, str]
) -> dict[str, Any]:
    """The report's opening: verdict, date, commit, links, training, gates, budgets, quarantine."""
    cfg = ctx.cfg
    paths = ctx.paths
    stress_gate_message = str(stress.get("gate", "stress gate failed"))
    training = training_summary(paths.checkpoints)
    if training is not None and (paths.checkpoints / "plots" / TRAIN_CURVE).exists():
        training["plot"] = TRAIN_CURVE
    choice = paths.tuning / "choice.json"
    if training is not None and training.get("tuning", {}).get("applied") and choice.exists():
        training["tuning_decisions"] = json.loads(choice.read_text(encoding="utf-8")).get("decisions", [])
    return cycle_context(
        verdict(bool(stress["passed"]), stress_gate_message, champion),
        _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        git_tags()[GIT_COMMIT_TAG],
        links,
        training,
        gate_rows(cfg, paths.metrics),
        read_budgets(paths.metrics),
        read_quarantine(paths.calibration),
    )


def write_report(
    summary: Mapping[str, Any],
    out_dir: Path,
    formats: Sequence[str],
    champion: Mapping[str, Any] | None = None,
    cycle: Mapping[str, Any] | None = None,
    train_curve: Path | None = None,
) -> dict[str, Any]:
    """Render the report of a stress summary into ``out_dir`` (atomically); returns the document."""
    with atomic_dir(out_dir) as tmp:
        plots = write_plots(summary, tmp)
        images: dict[str, bytes] = {}
        if train_curve is not None and train_curve.exists():
            shutil.copyfile(train_curve, tmp / TRAIN_CURVE)
            images["training curve"] = train_curve.read_bytes()
        report = build_report(
            summary, summary["policy"], summary.get("checkpoint"), summary["created_at"], plots, champion, cycle
        )
        if "json" in formats:
            write_json(tmp / "report.json", report)
        if "md" in formats:
            (tmp / "report.md").write_text(render_markdown(report), encoding="utf-8")
        if "html" in formats:
            images |= {name: (tmp / file).read_bytes() for name, file in plots.items()}
            (tmp / "report.html").write_text(render_html(report, images), encoding="utf-8")
    return report


def run_report(
    ctx: PhaseContext,
    checkpoint: str | Path | None = None,
    stress_dir: Path | None = None,
    out_dir: Path | None = None,
    *,
    champion: Mapping[str, Any] | None = None,
    links: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """Write ``report.{json,md,html}`` and the plots of the stress summary of ``checkpoint``; returns the
    metrics, verdict, tree and paths. The report opens with the cycle's verdict (:func:`build_cycle`)."""
    cfg = ctx.cfg
    paths = ctx.paths
    stress_dir = stress_dir or paths.stress
    out_dir = out_dir or paths.reports
    check_output(out_dir)
    ref = resolve_checkpoint(ctx, checkpoint)
    summary = load_stress_summary(stress_dir)
    if summary is None or summary.get("checkpoint") != ref:
        raise AgentFlowError(f"no stress summary of {ref} in {stress_dir}: run `agentflow stress` for it first")
    summary = with_oscar_finetune(summary, Path(cfg.base.data_dir) / "oscar_finetune" / "summary.json", ref)
    cycle = build_cycle(ctx, summary, champion, links or {})
    train_curve = paths.checkpoints / "plots" / TRAIN_CURVE
    report = write_report(summary, out_dir, cfg.report.formats, champion, cycle, train_curve)
    return {
        **report["metrics"],
        "passed": report["passed"],
        "gate": summary.get("gate", ""),
        "verdict": cycle["verdict"],
        "verdict_reason": cycle["reason"],
        "policy": report["policy"],
        "checkpoint": ref,
        "recommendation": report["recommendation"],
        "tree": "\n".join(tree_text(report_tree(report))),
        "report_dir": str(out_dir),
        "files": sorted(p.name for p in out_dir.iterdir()),
    }


class RecordingPolicy:
    """Wraps a policy and keeps every observation it was asked about (the states it visited)."""

    def __init__(self, act: PolicyFn) -> None:
        self.act = act
        self.obs: list[np.ndarray] = []

    def __call__(self, obs: np.ndarray, mask: np.ndarray) -> np.ndarray:
        """Record a copy of ``obs`` and answer with the wrapped policy's actions."""
        self.obs.append(np.array(obs, copy=True))
        return self.act(obs, mask)


def _slice_eval(
    ctx: PhaseContext,
    policy: LoadedPolicy,
    variants: Sequence[VariantSpec],
    episodes: int,
    pool_factory: PoolFactory,
) -> tuple[dict[str, float], np.ndarray, StressRollout]:
    """Mean evaluated return and success on the slice, the observations the policy saw, the rollout."""
    recorder = RecordingPolicy(policy.act)
    rollout = stress_rollout(
        ctx, LoadedPolicy(policy.name, policy.checkpoint, recorder), variants, episodes, pool_factory=pool_factory
    )
    eps = rollout.episodes
    stats = {
        "mean_evaluated_return": float(np.mean([e.evaluated_return for e in eps])),
        "success_rate": float(np.mean([e.success for e in eps])),
        "crash_episodes": sum(e.crashed for e in eps),
    }
    return stats, np.concatenate(recorder.obs), rollout


def run_champion_challenger(
    ctx: PhaseContext,
    challenger_ckpt: str | Path,
    champion_ckpt: str | Path | None,
    *,
    catalogue: Path | None = None,
    pool_factory: PoolFactory = build_pool,
) -> dict[str, Any]:
    """Evaluate challenger vs champion on the stable slice; returns ``PromotionDecision.to_dict()`` plus context.

    Both policies play ``report.champion_episodes`` episodes on the slice with the same seed.
    ``consistency`` is the challenger's action consistency over the canonical probes of the slice's
    variants; ``agreement_with_champion`` the share of states on which both greedy actions agree (the
    states both visited on the slice plus those probes), reported, not gated (see
    ``agentflow_core.evaluation.champion``). No champion: promote with reason "no champion yet".
    """
    cfg = ctx.cfg
    rc = cfg.report
    variants = load_variants(ctx, catalogue)
    sliced = champion_slice(variants, rc.champion_slice)
    challenger = load_policy(resolve_checkpoint(ctx, challenger_ckpt), ctx.process)
    ch_stats, ch_obs, ch_rollout = _slice_eval(ctx, challenger, sliced, rc.champion_episodes, pool_factory)
    context: dict[str, Any] = {
        "challenger": challenger.name,
        "challenger_checkpoint": challenger.checkpoint,
        "slice_variants": len(sliced),
        "episodes": rc.champion_episodes,
        "challenger_stats": ch_stats,
    }
    if champion_ckpt is None:
        decision = decide_promotion(
            ch_stats["mean_evaluated_return"], None, None, rc.promote_min_consistency, rc.promote_min_reward_gain
        )
        return {**decision.to_dict(), **context, "champion": None}
    champion = load_policy(resolve_checkpoint(ctx, champion_ckpt), ctx.process)
    cp_stats, cp_obs, cp_rollout = _slice_eval(ctx, champion, sliced, rc.champion_episodes, pool_factory)
    paired = paired_by_key(
        [(e.env_id, e.evaluated_return) for e in ch_rollout.episodes],
        [(e.env_id, e.evaluated_return) for e in cp_rollout.episodes],
    )
    scales = cart_scales(ctx)
    ids, features, families = consistency_variants(
        ch_rollout, [v.env_id for v in sliced], cfg.stress.consistency_variants
    )
    vocabulary = ctx.vocabulary
    probes = [
        probe_observation(state, feats, scales.get(fam, DEFAULT_CART_SCALE), vocabulary=vocabulary)
        for feats, fam in zip(features, families, strict=True)
        for state in ctx.process.probes
    ]
    states = np.concatenate([ch_obs, cp_obs, *([np.stack(probes)] if probes else [])])
    masks = np.ones((len(states), vocabulary.n_actions), dtype=bool)
    agreement = policy_agreement(challenger.act(states, masks), champion.act(states, masks))
    own = canonical_consistency(
        challenger.act,
        ids,
        features,
        [scales.get(f, DEFAULT_CART_SCALE) for f in families],
        ctx.process.probes,
        vocabulary=vocabulary,
    ).score
    decision = decide_promotion(
        ch_stats["mean_evaluated_return"],
        cp_stats["mean_evaluated_return"],
        own,
        rc.promote_min_consistency,
        rc.promote_min_reward_gain,
        paired,
        agreement,
    )
    return {
        **decision.to_dict(),
        **context,
        "champion": champion.name,
        "champion_checkpoint": champion.checkpoint,
        "champion_stats": cp_stats,
        "states_compared": int(len(states)),
        "challenger_consistency": own,
    }
