"""Evaluation plots (matplotlib, Agg backend): plotting lives at the edge, the core returns tables.

Each function takes the JSON form of a core result (so a report can be re-rendered from a saved
stress summary) and writes one PNG atomically.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (the backend must be chosen before pyplot loads)
import numpy as np  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from agentflow_core.atomic import atomic_file  # noqa: E402


def _save(fig: Figure, path: Path) -> Path:
    try:
        with atomic_file(path) as tmp:
            fig.savefig(tmp, format="png", dpi=110, bbox_inches="tight")
    finally:
        plt.close(fig)
    return path


def plot_coverage_heatmap(coverage: Mapping[str, Any], path: Path) -> Path:
    """Token frequency by ``family · group`` row; long-tail tokens in red, unseen ones struck with '∅'."""
    rows, tokens = coverage["rows"], coverage["tokens"]
    freq = np.asarray(coverage["frequency"], dtype=float).reshape(len(rows), len(tokens))
    tail, unseen = set(coverage["long_tail"]), set(coverage["unseen"])
    fig, ax = plt.subplots(figsize=(max(8.0, 0.45 * len(tokens)), max(3.0, 0.4 * len(rows) + 1.5)))
    image = ax.imshow(np.sqrt(freq), aspect="auto", cmap="viridis", vmin=0.0, vmax=1.0)
    ax.set_xticks(range(len(tokens)))
    ax.set_xticklabels([f"{t} ∅" if t in unseen else t for t in tokens], rotation=70, ha="right", fontsize=8)
    for label, token in zip(ax.get_xticklabels(), tokens, strict=True):
        if token in tail or token in unseen:
            label.set_color("red")
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels(rows, fontsize=8)
    for (r, t), value in np.ndenumerate(freq):
        if 0.0 < value < 0.01:
            ax.text(t, r, "•", ha="center", va="center", color="red", fontsize=9)
    bar = fig.colorbar(image, ax=ax)
    bar.set_label("share of visited states (sqrt scale)")
    ax.set_title(
        f"State coverage by family × {coverage['group_dimension']} — coverage {coverage['state_coverage']:.1%}; "
        f"red = long tail (<1%) or unseen",
        fontsize=10,
    )
    return _save(fig, path)


def plot_consistency_matrix(canonical: Mapping[str, Any], per_variant: Sequence[Mapping[str, Any]], path: Path) -> Path:
    """The K×K greedy-action agreement matrix, with each variant's success rate beside it."""
    matrix = np.asarray(canonical["matrix"], dtype=float)
    k = matrix.shape[0]
    fig, (ax, side) = plt.subplots(1, 2, figsize=(9.5, 7.5), gridspec_kw={"width_ratios": [12, 1]})
    image = ax.imshow(matrix if k else np.zeros((1, 1)), cmap="magma", vmin=0.0, vmax=1.0)
    ax.set_title(f"Policy consistency on canonical states: {canonical['score']:.1%} over {k} variants", fontsize=10)
    ax.set_xlabel("variant")
    ax.set_ylabel("variant")
    fig.colorbar(image, ax=ax, fraction=0.046, pad=0.02, label="agreement")
    success = np.array([[r["success_rate"] for r in per_variant]], dtype=float).T if per_variant else np.zeros((1, 1))
    side.imshow(np.nan_to_num(success, nan=0.0), cmap="RdYlGn", vmin=0.0, vmax=1.0, aspect="auto")
    side.set_xticks([0])
    side.set_xticklabels(["success"], rotation=70)
    side.set_yticks([])
    return _save(fig, path)


def write_plots(summary: Mapping[str, Any], out_dir: Path) -> dict[str, str]:
    """The coverage heatmap and the consistency matrix as PNGs in ``out_dir``; returns name -> file."""
    plot_coverage_heatmap(summary["coverage"], out_dir / "coverage_heatmap.png")
    cons = summary["consistency"]
    plot_consistency_matrix(cons["canonical"], cons["per_variant"], out_dir / "consistency_matrix.png")
    return {"State coverage": "coverage_heatmap.png", "Policy consistency": "consistency_matrix.png"}


def plot_learning_bench(result: Mapping[str, Any], path: Path) -> Path:
    """Each learner's test regret closed (process success where nothing is priced) against training seconds and steps."""
    priced = bool(result.get("priced"))
    y, y_label = (
        ("test_regret_closed", "test regret closed") if priced else ("test_process_success", "test process success")
    )
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for ax, x, label in zip(
        axes, ("train_s", "env_steps"), ("training wall time (s)", "environment steps"), strict=True
    ):
        for name in ("agentflow", "maskableppo", "maskableppo_bc"):
            curve = [c for c in result.get(name, {}).get("curve", []) if c[y] is not None]
            ax.plot([c[x] for c in curve], [c[y] for c in curve], "o-", ms=3, label=name)
        if priced:
            ax.axhline(0.0, color="black", ls=":", label="rules")
            ax.axhline(0.7, color="tab:gray", ls="--", label="70% of the regret")
        else:
            ax.axhline(result["test_process_success_rules"], color="black", ls=":", label="rules")
        ax.set(xlabel=label, ylabel=f"{y_label} (greedy)")
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle("Same catalogue, hyper-parameters, reward and test split")
    return _save(fig, path)
