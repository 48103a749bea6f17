"""NumPy kernels for the CPU learner: rollout sampling and the whole PPO minibatch step.

Why: at the minibatch sizes PPO is run with (SB3's default is 64) an update is ~60 tiny tensor
operations per minibatch, and on CPU torch's fixed cost per operation (dispatch, output
allocation; ``tanh`` on a 64x64 block takes ~12 us against ~2 us in NumPy, Adam's ``sqrt`` and
``div`` over 13k floats ~20 us each) is most of the time, not the arithmetic. These kernels do the
same arithmetic as :func:`~agentflow_core.rl.ppo.ppo_minibatch_step`,
:meth:`~agentflow_core.rl.flat_optim.FlatAdam.clip_grad_norm_` and
:meth:`~agentflow_core.rl.flat_optim.FlatAdam.step`, in the same order, on NumPy views of the very
same memory: parameters, gradients and Adam moments are views of FlatAdam's flat buffers, so the
torch module, its ``state_dict``, the optimizer state and checkpoints see every update as if torch
had made it. Results equal the torch path up to float32 rounding (``tests/test_ppo.py`` holds both
to autograd and to ``torch.optim.Adam``). CUDA, and any policy that is not a float32
:class:`~agentflow_core.rl.policy.ActorCritic`, keep the torch path.

Sampling draws its uniforms from the same ``torch.Generator`` as :meth:`ActorCritic.sample`, so
the random stream (and the checkpointed generator state) is the same on both paths.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch import nn

from agentflow_core.rl.flat_optim import FlatAdam
from agentflow_core.rl.policy import MASKED_LOGIT, ActorCritic

F32 = np.float32


def supports(policy: nn.Module, device: torch.device) -> bool:
    """Whether the NumPy kernels can run ``policy``: a float32 :class:`ActorCritic` on the CPU."""
    return (
        device.type == "cpu"
        and isinstance(policy, ActorCritic)
        and all(p.dtype == torch.float32 and p.device.type == "cpu" for p in policy.parameters())
    )


class Tower:
    """A Tanh MLP (``ActorCritic.actor`` or ``.critic``) as NumPy views of its weights and biases.

    With ``grads=True`` it also holds views of each parameter's ``.grad`` (FlatAdam's flat
    gradient buffer), which :meth:`backward` overwrites.
    """

    def __init__(self, linears: Sequence[nn.Linear], grads: bool = False) -> None:
        self.w = [layer.weight.detach().numpy() for layer in linears]
        self.b = [layer.bias.detach().numpy() for layer in linears]
        self.gw: list[np.ndarray] = []
        self.gb: list[np.ndarray] = []
        if grads:
            for layer in linears:
                if layer.weight.grad is None or layer.bias.grad is None:
                    raise ValueError("Tower(grads=True) needs every parameter's .grad allocated (FlatAdam binds them)")
                self.gw.append(layer.weight.grad.numpy())
                self.gb.append(layer.bias.grad.numpy())

    def forward(self, x: np.ndarray) -> tuple[np.ndarray, list[np.ndarray]]:
        """(output [B, out], the input of every layer) — the inputs are what :meth:`backward` needs."""
        inputs = [x]
        for w, b in zip(self.w[:-1], self.b[:-1], strict=True):
            x = x @ w.T
            x += b
            np.tanh(x, out=x)
            inputs.append(x)
        out = x @ self.w[-1].T
        out += self.b[-1]
        return out, inputs

    def backward(self, inputs: Sequence[np.ndarray], grad_out: np.ndarray) -> None:
        """Write dLoss/dW and dLoss/db of every layer from dLoss/doutput (``dW = g^T h``, ``tanh' = 1 - h^2``)."""
        for i in range(len(self.w) - 1, -1, -1):
            np.dot(grad_out.T, inputs[i], out=self.gw[i])
            np.sum(grad_out, axis=0, out=self.gb[i])
            if i:
                h = inputs[i]
                grad_out = grad_out @ self.w[i]
                grad_out *= 1.0 - h * h


def sample(
    actor: Tower, critic: Tower, obs: np.ndarray, mask: np.ndarray | None, uniform: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:meth:`ActorCritic.sample` in NumPy: (action int64, log_prob float32, value float32) per row.

    ``actor``/``critic`` are the policy's towers (build them once per rollout); ``uniform`` [B, A]
    are the draws ``ActorCritic.sample`` would take from its generator (Gumbel-max:
    ``argmax(logits - log(-log(u)))``; masked logits never win).
    """
    logits, _ = actor.forward(obs)
    if mask is not None:
        np.copyto(logits, F32(MASKED_LOGIT), where=~mask)
    gumbel = -np.log(-np.log(np.maximum(uniform, F32(1e-20))))
    action = np.argmax(logits + gumbel, axis=1)
    logits -= logits.max(axis=1, keepdims=True)
    log_prob = logits[np.arange(len(action)), action] - np.log(np.exp(logits).sum(axis=1))
    value, _ = critic.forward(obs)
    return action, log_prob, value[:, 0]


def towers(policy: ActorCritic) -> tuple[Tower, Tower]:
    """(actor, critic) views for :func:`sample` (valid until the parameters are re-allocated)."""
    return Tower(policy._actor_linears), Tower(policy._critic_linears)


def normalize_minibatch_advantages(advantages: np.ndarray, minibatch_size: int) -> np.ndarray:
    """Standardise each consecutive ``minibatch_size`` slice (unbiased std, as ``torch.std``)."""
    rows = advantages.reshape(-1, minibatch_size)
    out = (rows - rows.mean(axis=1, keepdims=True)) / (rows.std(axis=1, ddof=1, keepdims=True) + F32(1e-8))
    return out.reshape(-1)


def minibatch_stats(record: np.ndarray, clip_range: float) -> np.ndarray:
    """Mean loss statistics per minibatch, in ``STAT_KEYS`` order and unscaled, from the rows
    :meth:`PPOKernel.minibatch_step` recorded: ``record`` is [6, n_minibatches, B]."""
    pg_loss1, pg_loss2, diff, entropy, logratio, ratio = record
    ratio_m1 = ratio - F32(1.0)
    return np.stack(
        [
            np.maximum(pg_loss1, pg_loss2).mean(axis=1),
            (diff * diff).mean(axis=1),
            entropy.mean(axis=1),
            (ratio_m1 - logratio).mean(axis=1),
            logratio.mean(axis=1),
            (np.abs(ratio_m1) > clip_range).mean(axis=1),
        ],
        axis=1,
    )


class PPOKernel:
    """The CPU minibatch step and optimizer step of one update, on views of ``optimizer``'s buffers.

    Build it after :meth:`FlatAdam.ensure_bound` (views of stale storage would update nothing);
    it is cheap, so :class:`~agentflow_core.rl.ppo.PPO` builds one per update.
    """

    def __init__(self, policy: ActorCritic, optimizer: FlatAdam) -> None:
        self.actor = Tower(policy._actor_linears, grads=True)
        self.critic = Tower(policy._critic_linears, grads=True)
        self.optimizer = optimizer
        self.param = optimizer.flat_param.numpy()
        self.grad = optimizer.flat_grad.numpy()
        self.exp_avg = optimizer.exp_avg.numpy()
        self.exp_avg_sq = optimizer.exp_avg_sq.numpy()
        self.step_count = optimizer.step_t.numpy()  # 0-d view: the "step" in the optimizer state
        self._scratch = np.empty_like(self.param)

    def minibatch_step(
        self,
        obs: np.ndarray,
        illegal: np.ndarray | None,
        action_index: np.ndarray,
        old_logprob: np.ndarray,
        norm_advantages: np.ndarray,
        returns: np.ndarray,
        coef: Any,
        record: np.ndarray,
    ) -> None:
        """Set the gradient of :func:`~agentflow_core.rl.ppo.ppo_minibatch_loss` (formulas in
        :func:`~agentflow_core.rl.ppo.ppo_minibatch_step`).

        ``illegal`` is the negated action mask (True where an action is masked) or None;
        ``action_index`` the flat index ``row * n_actions + action`` of each taken action.
        ``record`` [6, B] receives in its rows pg_loss1, pg_loss2, V - R, entropy, log ratio
        and ratio: :func:`minibatch_stats` turns them into the loss statistics once per update,
        instead of six reductions per minibatch.
        """
        batch = obs.shape[0]
        logits, actor_inputs = self.actor.forward(obs)
        value_out, critic_inputs = self.critic.forward(obs)
        if illegal is not None:
            np.copyto(logits, F32(MASKED_LOGIT), where=illegal)
        logits -= logits.max(axis=1, keepdims=True)
        probs = np.exp(logits)
        total = probs.sum(axis=1, keepdims=True)
        probs /= total
        log_probs = logits
        log_probs -= np.log(total)
        pg_loss1, pg_loss2, diff, entropy, logratio, ratio = record
        np.einsum("ij,ij->i", probs, log_probs, out=entropy)
        np.negative(entropy, out=entropy)
        np.subtract(log_probs.take(action_index), old_logprob, out=logratio)
        np.exp(logratio, out=ratio)
        np.multiply(norm_advantages, ratio, out=pg_loss1)
        np.negative(pg_loss1, out=pg_loss1)
        np.minimum(np.maximum(ratio, F32(1.0 - coef.clip_range)), F32(1.0 + coef.clip_range), out=pg_loss2)
        pg_loss2 *= norm_advantages
        np.negative(pg_loss2, out=pg_loss2)
        np.subtract(value_out[:, 0], returns, out=diff)
        # r dL/dr: the unclipped term's gradient where it is the max, else 0 (the clipped one is flat)
        grad_logratio = pg_loss1 * (pg_loss1 >= pg_loss2)
        grad_logratio *= F32(1.0 / batch)
        if coef.kl_coef > 0.0:
            grad_logratio += (ratio - F32(1.0)) * F32(coef.kl_coef / batch)
        grad_logits = log_probs
        grad_logits += entropy[:, None]
        grad_logits *= F32(coef.ent_coef / batch)
        grad_logits -= grad_logratio[:, None]
        grad_logits *= probs
        grad_logits.reshape(-1)[action_index] += grad_logratio
        if illegal is not None:
            np.copyto(grad_logits, F32(0.0), where=illegal)
        self.actor.backward(actor_inputs, grad_logits)
        self.critic.backward(critic_inputs, (diff * F32(coef.vf_coef / batch))[:, None])

    def clip_grad_norm(self, max_norm: float) -> float:
        """:meth:`FlatAdam.clip_grad_norm_`: scale all grads by min(1, max_norm / (||g|| + 1e-6)); returns ||g||."""
        total = float(np.sqrt(np.dot(self.grad, self.grad)))
        self.grad *= F32(min(max_norm / (total + 1e-6), 1.0))
        return total

    def adam_step(self) -> None:
        """:meth:`FlatAdam.step` (torch's single-tensor Adam, operation for operation) in place."""
        group = self.optimizer.param_groups[0]
        beta1, beta2 = group["betas"]
        grad, exp_avg, exp_avg_sq, tmp = self.grad, self.exp_avg, self.exp_avg_sq, self._scratch
        self.step_count += 1
        step = float(self.step_count)
        np.subtract(grad, exp_avg, out=tmp)  # exp_avg.lerp_(grad, 1 - beta1)
        tmp *= F32(1 - beta1)
        exp_avg += tmp
        exp_avg_sq *= F32(beta2)  # exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
        np.multiply(grad, grad, out=tmp)
        tmp *= F32(1 - beta2)
        exp_avg_sq += tmp
        bias_correction1 = 1 - beta1**step
        bias_correction2 = 1 - beta2**step
        np.sqrt(exp_avg_sq, out=tmp)  # denom = sqrt(v) / sqrt(bc2) + eps
        tmp /= F32(bias_correction2**0.5)
        tmp += F32(group["eps"])
        np.divide(exp_avg, tmp, out=tmp)  # param.addcdiv_(exp_avg, denom, value=-lr / bc1)
        tmp *= F32(-group["lr"] / bias_correction1)
        self.param += tmp
