"""The cycle's exit gates as declared data, and their evaluation (docs/design.md §2.2).

Every gate is built from ``params.yaml`` (:func:`declared_gates`): the phase, the checks
(metric, comparison, threshold), what the phase does to reach the gate before it is judged
(remediation) and its budget. ``agentflow validate`` prints exactly these records, and the flow,
the CLI and the DVC stages judge a phase's metrics with :func:`evaluate_gate` against exactly
these records, so what is printed is what is enforced.

A failed gate has one message naming the gate, the metric, its value and the threshold
(:attr:`GateVerdict.message`). Pure: no I/O, no tracking; the callers decide what a failure does.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from agentflow_core.config import AgentFlowConfig, StressConfig

Comparison = Literal[">=", "<="]


@dataclass(frozen=True)
class GateCheck:
    """One enforced comparison: ``metric op threshold``."""

    metric: str
    op: Comparison
    threshold: float

    def holds(self, value: float) -> bool:
        """True when ``value`` passes (a NaN never does)."""
        if math.isnan(value):
            return False
        return value >= self.threshold if self.op == ">=" else value <= self.threshold

    def describe(self) -> str:
        """``metric >= threshold`` as text."""
        return f"{self.metric} {self.op} {self.threshold:g}"


@dataclass(frozen=True)
class PhaseGate:
    """A phase's exit gate: its checks, its remediation and its budget, as configured."""

    phase: str
    checks: tuple[GateCheck, ...]
    remediation: str
    budget_s: float
    budget_steps: int | None = None

    def describe(self) -> str:
        """One line: the checks, then remediation and budget."""
        checks = " and ".join(c.describe() for c in self.checks) or "no threshold (recorded only)"
        steps = f", {self.budget_steps} env steps" if self.budget_steps is not None else ""
        return f"{checks}; remediation: {self.remediation}; budget: {self.budget_s:g} s{steps}"


@dataclass(frozen=True)
class GateVerdict:
    """The outcome of judging one phase's metrics against its gate."""

    phase: str
    passed: bool
    failed_checks: tuple[tuple[GateCheck, float], ...]

    @property
    def message(self) -> str:
        """One line naming the gate, each failed metric with its value, and its threshold."""
        if self.passed:
            return f"{self.phase} gate passed"
        parts = [f"{c.metric}={value:.4g} (required {c.op} {c.threshold:g})" for c, value in self.failed_checks]
        return f"{self.phase} gate failed: " + "; ".join(parts)


def calibrate_gate(cfg: AgentFlowConfig) -> PhaseGate:
    """Phase 0: the share of sampled variants that fail, and the mapping audit."""
    c = cfg.calibrate
    return PhaseGate(
        "calibrate",
        (GateCheck("failed_fraction", "<=", c.max_failed_fraction), GateCheck("audit_errors", "<=", 0.0)),
        (
            f"a variant fails on reward variance >= {c.max_reward_variance:g}, the rules' success < "
            f"{c.min_expert_success:g}, a crash or a non-deterministic replay; failed variants are quarantined "
            "(left out of the catalogue, so out of explore, train and stress)"
        ),
        c.budget_s,
    )


def explore_gate(cfg: AgentFlowConfig) -> PhaseGate:
    """Phase 1: state coverage after the planned steps plus at most the remediation budget."""
    e = cfg.explore
    r = e.remediation
    remediation = (
        f"while below {e.min_state_coverage:g} after {e.total_steps} steps, explore up to {r.max_steps} more "
        f"with epsilon {r.epsilon:g}"
        if r.max_steps
        else "none"
    )
    return PhaseGate(
        "explore",
        (GateCheck("state_coverage_ratio", ">=", e.min_state_coverage),),
        remediation,
        e.budget_s,
        e.total_steps + r.max_steps,
    )


def offline_gate(cfg: AgentFlowConfig) -> PhaseGate:
    """Phase 1b: the BC+CQL actor's validation process success, absolute and against the BC actor's.

    Against BC the gate reads the upper 95% bound of the paired per-episode difference (both actors on
    the same validation episodes, ``agentflow_core.evaluation.paired``): the stage fails only when the
    sample shows the BC+CQL actor worse than BC by more than the margin, not on a raw difference that
    a handful of episodes can push past it.
    """
    o = cfg.offline
    return PhaseGate(
        "offline",
        (
            GateCheck("offline_validation_process_success", ">=", o.gate.min_validation_process_success),
            GateCheck("offline_vs_bc_validation_high", ">=", -o.gate.max_regression_vs_bc),
        ),
        "none (set offline.enabled: false to train from the BC actor alone)"
        if cfg.train.bc_warm_start
        else "none (set offline.enabled: false to skip the stage: PPO starts from a fresh network either way)",
        o.budget_s,
    )


def train_gate(cfg: AgentFlowConfig) -> PhaseGate:
    """Phase 2: stop on the convergence flag or the step/time budget; the best checkpoint's validation success."""
    t = cfg.train
    checks = [GateCheck("validation_process_success", ">=", t.gate.min_validation_process_success)]
    if t.gate.require_convergence:
        checks.append(GateCheck("policy_convergence_flag", ">=", 1.0))
    stop = "stop at policy_convergence_flag or the step budget" if t.gate.stop_on_convergence else "run the step budget"
    return PhaseGate("train", tuple(checks), f"{stop}, or at the wall-clock budget", t.budget_s, t.total_steps)


def stress_checks(s: StressConfig) -> tuple[GateCheck, ...]:
    """Phase 3's checks: robustness, consistency and crash rate, all three."""
    return (
        GateCheck("robustness_score", ">=", s.min_robustness),
        GateCheck("consistency", ">=", s.consistency_target),
        GateCheck("crash_rate", "<=", s.max_crash_rate),
    )


def sim_to_real_checks(s: StressConfig) -> tuple[GateCheck, ...]:
    """The sim-to-real gap checks (largest per-family gap in process success; the gap on the django-oscar store
    when that run is on), when the run is enabled."""
    real = s.sim_to_real
    if not real.enabled:
        return ()
    oscar = (GateCheck("sim_to_real_gap_oscar", "<=", real.max_gap),) if real.oscar_episodes > 0 else ()
    return (GateCheck("sim_to_real_max_gap", "<=", real.max_gap), *oscar)


def stress_gate(cfg: AgentFlowConfig) -> PhaseGate:
    """Phase 3: robustness, consistency and crash rate, all three (and the sim-to-real gap when enabled)."""
    return PhaseGate(
        "stress",
        stress_checks(cfg.stress) + sim_to_real_checks(cfg.stress),
        "none (the report is still written; a checkpoint that fails it is never promoted)",
        cfg.stress.budget_s,
    )


def declared_gates(cfg: AgentFlowConfig) -> tuple[PhaseGate, ...]:
    """Every enforced gate, in the order the cycle meets them."""
    offline = (offline_gate(cfg),) if cfg.offline.enabled else ()
    return (calibrate_gate(cfg), explore_gate(cfg), *offline, train_gate(cfg), stress_gate(cfg))


def gate_for(cfg: AgentFlowConfig, phase: str) -> PhaseGate:
    """The declared gate of ``phase`` (KeyError for a phase without one)."""
    gates = {g.phase: g for g in declared_gates(cfg)}
    return gates[phase]


def evaluate_gate(gate: PhaseGate, metrics: Mapping[str, float | int | bool]) -> GateVerdict:
    """Judge ``metrics`` against ``gate``; a missing metric fails its check (as NaN)."""
    failed = []
    for check in gate.checks:
        value = float(metrics.get(check.metric, math.nan))
        if not check.holds(value):
            failed.append((check, value))
    return GateVerdict(gate.phase, not failed, tuple(failed))


@dataclass(frozen=True)
class BudgetUse:
    """A phase's budget: used vs allotted wall-clock seconds (and env steps where the phase steps envs)."""

    phase: str
    wall_s: float
    budget_s: float
    steps: int | None = None
    budget_steps: int | None = None

    @property
    def within(self) -> bool:
        """True when neither the time nor the step allotment was exceeded."""
        steps_ok = self.steps is None or self.budget_steps is None or self.steps <= self.budget_steps
        return self.wall_s <= self.budget_s and steps_ok

    def metrics(self) -> dict[str, float]:
        """``budget/<phase>/wall_s`` etc., for tracking."""
        out = {f"budget/{self.phase}/wall_s": self.wall_s, f"budget/{self.phase}/budget_s": self.budget_s}
        out[f"budget/{self.phase}/wall_fraction"] = self.wall_s / self.budget_s
        if self.steps is not None and self.budget_steps:
            out[f"budget/{self.phase}/steps"] = float(self.steps)
            out[f"budget/{self.phase}/budget_steps"] = float(self.budget_steps)
        return out
