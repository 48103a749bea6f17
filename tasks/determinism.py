"""One place that makes a run reproducible, called by every entry point before any phase runs.

The CLI commands (and so the DVC stages, which call them), the Prefect flow and each of its tasks
(and so a deployment run) call :func:`make_deterministic` with ``base.seed``. Same commit and
params on the same machine then give bit-identical checkpoints whichever path ran them.

Torch and NumPy's BLAS run on one thread each: the policy is a small MLP, where more threads only
add contention (docs/stack-notes.md "CPU threads"), and a thread count that follows the core count changes the order of
float reductions, so the result would depend on the machine's core count. OpenBLAS's default (one
spinning thread per core) is the costly one: next to busy env workers, a 512x64 matmul measured
20x slower with 2 BLAS threads than with 1 on this 2-core machine. What can still differ
across machines: the BLAS/ATen CPU kernels torch picks for the instruction set it finds
(AVX2 vs AVX-512 vs ARM), and the NumPy build's BLAS; both change float rounding, which PPO
amplifies into different trajectories. Identical results are promised for one machine type.
"""

from __future__ import annotations

import os
import random

import numpy as np

TORCH_THREADS = 1


def make_deterministic(seed: int) -> None:
    """Pin torch threads, seed the global generators and ask torch for deterministic kernels.

    The phases draw their randomness from generators seeded from ``base.seed`` themselves; seeding
    the global ones as well covers library code that falls back to them.
    """
    import torch
    from threadpoolctl import threadpool_limits

    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # required by deterministic cuBLAS
    torch.set_num_threads(TORCH_THREADS)
    threadpool_limits(limits=TORCH_THREADS)  # NumPy's BLAS: kept for the process, not a context
    deterministic_kernels()
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def deterministic_kernels() -> None:
    """``torch.use_deterministic_algorithms(True, warn_only=True)`` without its import of TorchInductor.

    The public call also sets ``torch._inductor.config.deterministic``, and importing that config
    costs about 2 s of CPU here (2.0 s measured on the 2-core machine, once per process) on every
    command's start -- beside a private Ray's start-up and its env workers' imports. The flag only
    steers ``torch.compile``, which AgentFlow never calls; the kernels are chosen by the C-level
    switch alone. An inductor config some other code imported already gets its flag set as well.
    """
    import sys

    import torch

    set_flag = getattr(torch._C, "_set_deterministic_algorithms", None)
    if set_flag is None:  # another torch: the public call, import and all
        torch.use_deterministic_algorithms(True, warn_only=True)
        return
    inductor = sys.modules.get("torch._inductor.config")
    if inductor is not None:
        setattr(inductor, "deterministic", True)  # noqa: B010 (a module attribute mypy cannot see)
    set_flag(True, warn_only=True)


def determinism_tags() -> dict[str, str]:
    """What a tracked run records about the numeric environment it ran in."""
    import torch
    from threadpoolctl import threadpool_info

    return {
        "agentflow.torch_threads": str(torch.get_num_threads()),
        "agentflow.blas_threads": ",".join(str(pool["num_threads"]) for pool in threadpool_info()),
        "agentflow.torch_version": torch.__version__,
        "agentflow.cpu_capability": str(torch.backends.cpu.get_cpu_capability()),
    }
