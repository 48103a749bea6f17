"""Discriminator reward validator (docs/design-003.md §3.2; GAIL's discriminator, Ho & Ermon 2016): is this the expert's behaviour?

The threshold check of :mod:`agentflow_core.evaluation.hacking` catches reward collected without the
business outcome once an episode has ended. The validator judges *how* an episode was played: a
classifier ``D(s, a)`` over (business-state tokens of ``s``, semantic action ``a``) is trained to
output 1 on the expert's steps of the exploration data (rows with ``explored == False``) and 0 on
a policy's steps at the same states -- the near-uniform policy a fresh network is, i.e. a legal
action drawn uniformly from the ones the expert did not take. An episode's *authenticity* is the
geometric mean of ``D`` over its steps, ``exp(mean log D)`` (the per-step average of GAIL's
``log D`` reward, mapped back to [0, 1]); below ``threshold`` it is suspicious. Loops that farm
shaping reward (adding and removing the cart, cancelling and re-adding, stalling on a shaped
state) are made of steps the expert never takes, and one such step with ``D`` near 0 weighs
more in a geometric than in an arithmetic mean, so a short detour is not averaged away.

In training, the positive rewards of suspicious episodes are multiplied by ``suspicious_weight``
(docs/design-003.md §3.2's ``reward * authenticity``, as a cut: honest episodes keep their whole reward;
penalties are never reduced). The stress analysis and the report list suspicious episodes.

Input is the token part of the observation only (the multi-hot business state, the same in every
channel), so the validator reads the PPO buffer, stress step records and dataset rows alike.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file, save_file
from torch import nn

from agentflow_core.atomic import atomic_file
from agentflow_core.evaluation.records import EpisodeRecord, StepRecord
from agentflow_core.semantics import Vocabulary

VALIDATOR_FILE = "discriminator.safetensors"
MINIBATCH = 512
D_FLOOR = 1e-6  # log D of a step the discriminator is sure about stays finite
MIN_UPDATES = 600


def features(state_tokens: np.ndarray, actions: np.ndarray, n_tokens: int, n_actions: int) -> np.ndarray:
    """``[B, n_tokens + n_actions]``: the multi-hot state (an obs' first ``n_tokens`` entries) + one-hot action."""
    x = np.zeros((len(actions), n_tokens + n_actions), dtype=np.float32)
    x[:, :n_tokens] = np.asarray(state_tokens, dtype=np.float32)[:, :n_tokens] > 0.5
    x[np.arange(len(actions)), n_tokens + np.asarray(actions, dtype=np.int64)] = 1.0
    return x


def policy_negatives(masks: np.ndarray, actions: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """One legal action per state drawn uniformly among those other than ``actions`` (the action itself if alone)."""
    actions = np.asarray(actions, dtype=np.int64)
    allowed = np.asarray(masks, bool).copy()
    allowed[np.arange(len(actions)), actions] = False
    scores = np.where(allowed, rng.random(allowed.shape), -1.0)  # argmax of uniform scores: a uniform legal pick
    return np.where(allowed.any(1), scores.argmax(1), actions)


class Discriminator(nn.Module):
    """``D(s, a)`` logits: one hidden layer over the token/action features of one process's vocabulary."""

    def __init__(self, n_tokens: int, n_actions: int, hidden: int = 64) -> None:
        super().__init__()
        self.n_tokens, self.n_actions, self.hidden = n_tokens, n_actions, hidden
        self.net = nn.Sequential(nn.Linear(n_tokens + n_actions, hidden), nn.Tanh(), nn.Linear(hidden, 1))

    def features(self, state_tokens: np.ndarray, actions: np.ndarray) -> np.ndarray:
        """:func:`features` at this discriminator's widths."""
        return features(state_tokens, actions, self.n_tokens, self.n_actions)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Logit of "expert step", shape [B]."""
        return self.net(x).squeeze(-1)

    @torch.no_grad()
    def authenticity(self, x: np.ndarray) -> np.ndarray:
        """``D`` per step in [0, 1]."""
        if len(x) == 0:
            return np.zeros(0, dtype=np.float32)
        return torch.sigmoid(self(torch.as_tensor(x))).numpy()


@dataclass(frozen=True)
class FitResult:
    """Training outcome: samples per class, final loss and held-out accuracy (10% of the states)."""

    expert_samples: int
    policy_samples: int
    final_loss: float
    heldout_accuracy: float
    heldout_states: int = 0

    def to_dict(self) -> dict[str, float]:
        """Metrics form (``validator/...``)."""
        return {
            "validator/expert_samples": float(self.expert_samples),
            "validator/policy_samples": float(self.policy_samples),
            "validator/final_loss": self.final_loss,
            "validator/heldout_accuracy": self.heldout_accuracy,
            "validator/heldout_states": float(self.heldout_states),
        }


def fit_discriminator(
    obs: np.ndarray, masks: np.ndarray, actions: np.ndarray, *, n_tokens: int, hidden: int, epochs: int, seed: int
) -> tuple[Discriminator, FitResult]:
    """Train ``D`` on expert (state, action) rows vs a uniform-other-legal action at the same states (BCE, Adam).

    ``n_tokens`` is the width of the process's token block (the start of each obs); the action width is the masks'.
    """
    rng = np.random.default_rng(seed)
    torch.manual_seed(seed)
    n = len(actions)
    order = rng.permutation(n)
    n_val = max(1, n // 10) if n >= 10 else 0
    val, train = order[:n_val], order[n_val:]
    model = Discriminator(n_tokens, int(np.shape(masks)[1]), hidden)

    def pairs(idx: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        neg = policy_negatives(masks[idx], actions[idx], rng)
        x = np.concatenate([model.features(obs[idx], actions[idx]), model.features(obs[idx], neg)])
        y = np.concatenate([np.ones(len(idx), np.float32), np.zeros(len(idx), np.float32)])
        return torch.as_tensor(x), torch.as_tensor(y)

    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    loss_fn = nn.BCEWithLogitsLoss()
    loss = torch.zeros(())
    updates, epoch = 0, 0
    while epoch < epochs or updates < MIN_UPDATES:  # a small dataset still gets MIN_UPDATES gradient steps
        epoch += 1
        x, y = pairs(train)  # fresh negatives each epoch
        perm = torch.as_tensor(rng.permutation(len(y)))
        for start in range(0, len(y), MINIBATCH):
            updates += 1
            mb = perm[start : start + MINIBATCH]
            loss = loss_fn(model(x[mb]), y[mb])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    accuracy = float("nan")
    if n_val:
        x, y = pairs(val)
        with torch.no_grad():
            accuracy = float(((model(x) > 0).float() == y).float().mean())
    return model, FitResult(n, n, float(loss.detach()), accuracy, n_val)


def save_discriminator(model: Discriminator, path: Path) -> None:
    """Weights (and the widths, as tensors) in one safetensors file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.contiguous() for k, v in model.state_dict().items()}
    widths = torch.tensor([model.n_tokens, model.n_actions])
    with atomic_file(path) as tmp:
        save_file(tensors | {"hidden": torch.tensor([model.hidden]), "widths": widths}, str(tmp))


def load_discriminator(path: Path) -> Discriminator:
    """Inverse of :func:`save_discriminator`."""
    tensors = load_file(str(path))
    n_tokens, n_actions = (int(w) for w in tensors.pop("widths"))
    model = Discriminator(n_tokens, n_actions, int(tensors.pop("hidden")[0]))
    model.load_state_dict(tensors)
    return model


def authenticity_score(d: np.ndarray) -> float:
    """An episode's authenticity from its steps' ``D``: ``exp(mean log D)`` (``D`` floored at ``D_FLOOR``)."""
    return float(np.exp(np.log(np.clip(d, D_FLOOR, 1.0)).mean()))


def episode_authenticity(model: Discriminator, steps: Sequence[StepRecord], vocabulary: Vocabulary) -> dict[str, float]:
    """Each episode's :func:`authenticity_score`, keyed by episode id (states encoded in ``vocabulary``)."""
    if not steps:
        return {}
    states = np.stack([vocabulary.encode(s.state_tokens, {}) for s in steps])
    d = np.log(np.clip(model.authenticity(model.features(states, np.array([s.action for s in steps]))), D_FLOOR, 1.0))
    sums: dict[str, float] = defaultdict(float)
    counts: Counter[str] = Counter()
    for s, value in zip(steps, d.tolist(), strict=True):
        sums[s.episode_id] += value
        counts[s.episode_id] += 1
    return {e: float(np.exp(sums[e] / counts[e])) for e in counts}


@dataclass(frozen=True)
class ValidatorReport:
    """Suspicious episodes of a stress run: how many, their share, by family, the least authentic examples."""

    threshold: float
    flagged: int
    rate: float
    mean_authenticity: float
    by_family: dict[str, int]
    examples: list[dict[str, Any]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form for the stress analysis."""
        return {
            "threshold": self.threshold,
            "flagged": self.flagged,
            "rate": self.rate,
            "mean_authenticity": self.mean_authenticity,
            "by_family": self.by_family,
            "examples": self.examples,
        }


def validate_episodes(
    model: Discriminator,
    episodes: Sequence[EpisodeRecord],
    steps: Sequence[StepRecord],
    threshold: float,
    vocabulary: Vocabulary,
    max_examples: int = 5,
) -> ValidatorReport:
    """Flag the episodes whose mean authenticity is below ``threshold``."""
    score = episode_authenticity(model, steps, vocabulary)
    scored = [(e, score.get(e.episode_id, 1.0)) for e in episodes]
    flagged = sorted(((e, a) for e, a in scored if a < threshold), key=lambda ea: ea[1])
    examples = [
        {
            "episode_id": e.episode_id,
            "env_id": e.env_id,
            "authenticity": round(a, 4),
            "shaped_return": round(e.shaped_return, 4),
            "length": e.length,
            "success": e.success,
        }
        for e, a in flagged[:max_examples]
    ]
    return ValidatorReport(
        threshold,
        len(flagged),
        len(flagged) / len(episodes) if episodes else 0.0,
        float(np.mean([a for _, a in scored])) if scored else 0.0,
        dict(Counter(e.family for e, _ in flagged).most_common()),
        examples,
    )


class RolloutValidator:
    """The PPO hook (``agentflow_core.contracts.RewardValidatorHook``): scale suspicious episodes' positive rewards.

    Episodes are the runs of steps between ``done`` flags in each slot's column (a rollout slice
    starts with a reset, so every column starts an episode); the last, unfinished one is judged on
    the steps it has.
    """

    def __init__(self, model: Discriminator, threshold: float, weight: float) -> None:
        self.model, self.threshold, self.weight = model, threshold, weight
        self._episodes = 0
        self._suspicious = 0
        self._authenticity = 0.0

    def reweight(self, obs: np.ndarray, actions: np.ndarray, done: np.ndarray, rewards: np.ndarray) -> np.ndarray:
        """Rewards with the positive ones of suspicious episodes times ``weight``."""
        n_steps, num_envs = actions.shape
        d = self.model.authenticity(self.model.features(obs.reshape(n_steps * num_envs, -1), actions.reshape(-1)))
        d = d.reshape(n_steps, num_envs)
        out = np.array(rewards, dtype=np.float32, copy=True)
        for i in range(num_envs):
            ends = np.flatnonzero(done[:, i]).tolist()
            if not ends or ends[-1] != n_steps - 1:
                ends.append(n_steps - 1)
            start = 0
            for end in ends:
                authenticity = authenticity_score(d[start : end + 1, i])
                self._episodes += 1
                self._authenticity += authenticity
                if authenticity < self.threshold:
                    self._suspicious += 1
                    seg = out[start : end + 1, i]
                    out[start : end + 1, i] = np.where(seg > 0, seg * self.weight, seg)
                start = end + 1
        return out

    def metrics(self) -> dict[str, float]:
        """Share of suspicious episodes and mean authenticity since the last call."""
        n = max(self._episodes, 1)
        out = {
            "validator/suspicious_share": self._suspicious / n,
            "validator/mean_authenticity": self._authenticity / n,
        }
        self._episodes, self._suspicious, self._authenticity = 0, 0, 0.0
        return out
