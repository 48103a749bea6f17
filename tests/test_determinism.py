"""make_deterministic: deterministic kernels on, one thread, and no TorchInductor import on the way."""

from __future__ import annotations

import subprocess
import sys

import torch

from tasks.determinism import TORCH_THREADS, deterministic_kernels, make_deterministic

PROBE = """
import sys, torch
from tasks.determinism import make_deterministic
make_deterministic(0)
assert torch.are_deterministic_algorithms_enabled()
assert torch.is_deterministic_algorithms_warn_only_enabled()
print("inductor" if "torch._inductor.config" in sys.modules else "no-inductor")
"""


def test_make_deterministic_enables_deterministic_kernels_without_importing_inductor() -> None:
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, check=True, timeout=120)
    assert out.stdout.strip() == "no-inductor"


def test_make_deterministic_matches_the_public_switch() -> None:
    before = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled())
    try:
        torch.use_deterministic_algorithms(False)
        make_deterministic(0)
        assert torch.get_num_threads() == TORCH_THREADS
        assert torch.are_deterministic_algorithms_enabled()
        assert torch.is_deterministic_algorithms_warn_only_enabled()
        first = torch.rand(3)
        make_deterministic(0)
        assert torch.equal(first, torch.rand(3))
    finally:
        torch.use_deterministic_algorithms(before[0], warn_only=before[1])


def test_an_imported_inductor_config_gets_the_flag_too() -> None:
    import torch._inductor.config as inductor_config

    before = inductor_config.deterministic
    try:
        inductor_config.deterministic = False
        deterministic_kernels()
        assert inductor_config.deterministic is True
    finally:
        inductor_config.deterministic = before
