"""Adam and grad-norm clipping over one contiguous buffer: a handful of tensor ops per step for any model.

A PPO minibatch step on a 64x64 actor-critic is dominated by per-call framework overhead, not
arithmetic. :class:`FlatAdam` re-points every parameter (and its ``.grad``) at a view of one flat
buffer, so the global grad norm, the clip and the whole Adam update are ~10 element-wise ops on
three flat tensors instead of a per-parameter loop. The update rule is torch's single-tensor Adam,
operation for operation (``lerp_``, ``mul_``/``addcmul_``, ``sqrt``/``add_``, ``addcdiv_``, Python
float bias corrections), and the optimizer is a ``torch.optim.Adam``: ``state_dict`` /
``load_state_dict`` keep torch's format, so checkpoints are interchangeable with a stock Adam.

Anything that swaps a parameter's storage (``load_state_dict(assign=True)``, ``param.data = ...``)
unbinds it; :meth:`FlatAdam.bind` (called by :meth:`FlatAdam.ensure_bound`) copies values back in.
"""

from __future__ import annotations

import torch
from torch import nn


class FlatAdam(torch.optim.Adam):
    """Plain Adam (no weight decay, amsgrad or maximize) on flat parameter/grad/moment buffers."""

    def __init__(
        self, params: list[nn.Parameter], lr: float, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8
    ) -> None:
        super().__init__(params, lr=lr, betas=betas, eps=eps, foreach=False)
        if len(self.param_groups) != 1:
            raise ValueError("FlatAdam takes one parameter group")
        self.params: list[nn.Parameter] = list(self.param_groups[0]["params"])
        first = self.params[0]
        n = sum(p.numel() for p in self.params)
        self.flat_param = torch.empty(n, device=first.device, dtype=first.dtype)
        self.flat_grad = torch.zeros_like(self.flat_param)
        self.exp_avg = torch.zeros_like(self.flat_param)
        self.exp_avg_sq = torch.zeros_like(self.flat_param)
        self.step_t = torch.zeros((), dtype=torch.float32)
        self.bind()

    def _views(self, flat: torch.Tensor) -> list[torch.Tensor]:
        views, offset = [], 0
        for p in self.params:
            views.append(flat[offset : offset + p.numel()].view_as(p))
            offset += p.numel()
        return views

    def bind(self) -> None:
        """Copy current values (weights, moments, step) into the flat buffers and alias every tensor to them."""
        with torch.no_grad():
            steps = [self.state[p]["step"] for p in self.params if "step" in self.state.get(p, {})]
            step = float(steps[0]) if steps else 0.0
            self.step_t = torch.tensor(step, dtype=torch.float32)
            for p, w, g, m, v in zip(
                self.params,
                self._views(self.flat_param),
                self._views(self.flat_grad),
                self._views(self.exp_avg),
                self._views(self.exp_avg_sq),
                strict=True,
            ):
                state = self.state.get(p, {})
                w.copy_(p.detach())
                m.copy_(state.get("exp_avg", 0.0))
                v.copy_(state.get("exp_avg_sq", 0.0))
                p.data = w
                p.grad = g
                self.state[p] = {"step": self.step_t, "exp_avg": m, "exp_avg_sq": v}

    def is_bound(self) -> bool:
        """Do all parameters, grads and moments still alias the flat buffers?"""
        for p, w, g, m in zip(
            self.params,
            self._views(self.flat_param),
            self._views(self.flat_grad),
            self._views(self.exp_avg),
            strict=True,
        ):
            state = self.state.get(p, {})
            if (
                p.data_ptr() != w.data_ptr()
                or p.grad is None
                or p.grad.data_ptr() != g.data_ptr()
                or state.get("exp_avg") is None
                or state["exp_avg"].data_ptr() != m.data_ptr()
            ):
                return False
        return True

    def ensure_bound(self) -> None:
        """Re-bind if anything swapped storage since the last bind (cheap check, once per update)."""
        if not self.is_bound():
            self.bind()

    def load_state_dict(self, state_dict: dict) -> None:  # type: ignore[override]
        super().load_state_dict(state_dict)
        self.bind()

    @torch.no_grad()
    def clip_grad_norm_(self, max_norm: float) -> torch.Tensor:
        """Scale all grads by min(1, max_norm / (||g||_2 + 1e-6)) without a host sync; returns ||g||_2."""
        total = torch.linalg.vector_norm(self.flat_grad)
        self.flat_grad.mul_(torch.clamp(max_norm / (total + 1e-6), max=1.0))
        return total

    @torch.no_grad()
    def step(self, closure: None = None) -> None:  # type: ignore[override]
        """One Adam step over the flat buffers, in the order of torch's ``_single_tensor_adam``."""
        group = self.param_groups[0]
        beta1, beta2 = group["betas"]
        self.step_t += 1
        step = float(self.step_t)
        self.exp_avg.lerp_(self.flat_grad, 1 - beta1)
        self.exp_avg_sq.mul_(beta2).addcmul_(self.flat_grad, self.flat_grad, value=1 - beta2)
        bias_correction1 = 1 - beta1**step
        bias_correction2 = 1 - beta2**step
        denom = (self.exp_avg_sq.sqrt() / bias_correction2**0.5).add_(group["eps"])
        self.flat_param.addcdiv_(self.exp_avg, denom, value=-group["lr"] / bias_correction1)
