"""Every width and name comes from the selected process's Vocabulary: no module reads checkout's constants.

``agentflow_core/semantics.py`` is the one place that spells the checkout vocabulary out (its module
constants and the ``CHECKOUT`` value built from them). Any other module of the product that imports one
of those constants, or reads it as ``semantics.NAME``, would size or name something after checkout
whatever process ``params.yaml`` selects; this scan (of the parsed source, not of text) finds it.
"""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CHECKOUT_DEFINITION = REPO / "agentflow_core" / "semantics.py"
PACKAGES = ("agentflow_core", "agentflow_refund", "tasks", "flows", "benchmarks")
CHECKOUT_CONSTANTS = frozenset(
    {
        "VOCAB_VERSION",
        "TOKENS",
        "TOKEN_INDEX",
        "N_TOKENS",
        "ACTIONS",
        "N_ACTIONS",
        "SemanticAction",
        "ACTION_RISK",
        "FEATURES",
        "FEATURE_INDEX",
        "N_FEATURES",
        "OBS_DIM",
        "GOAL_TOKEN",
        "HANDLED_OUTCOMES",
        "EXCLUSIVE_TOKENS",
        "CHECKOUT_SCENARIO",
        # module-level helpers over those constants (a Vocabulary has its own)
        "encode",
        "decode_tokens",
        "decode_features",
        "accepted_outcomes",
        "process_success",
    }
)


def _modules() -> list[Path]:
    found = [path for package in PACKAGES for path in sorted((REPO / package).rglob("*.py"))]
    return [path for path in found if path != CHECKOUT_DEFINITION]


def constant_reads(source: str) -> list[tuple[int, str]]:
    """(line, name) of every import of a checkout constant from the semantics module and every ``semantics.NAME``."""
    found = []
    aliases = {"semantics"}
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.module == "agentflow_core.semantics":
            found += [(node.lineno, a.name) for a in node.names if a.name in CHECKOUT_CONSTANTS]
        elif isinstance(node, ast.ImportFrom) and node.module == "agentflow_core":
            aliases |= {a.asname or a.name for a in node.names if a.name == "semantics"}
        elif isinstance(node, ast.Import):
            aliases |= {a.asname for a in node.names if a.name == "agentflow_core.semantics" and a.asname}
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and node.attr in CHECKOUT_CONSTANTS:
            owner = node.value
            dotted = isinstance(owner, ast.Attribute) and owner.attr == "semantics"
            if dotted or (isinstance(owner, ast.Name) and owner.id in aliases):
                found.append((node.lineno, node.attr))
    return found


def test_the_scan_finds_each_way_of_reading_a_constant() -> None:
    source = (
        "from agentflow_core.semantics import OBS_DIM, Vocabulary\n"
        "from agentflow_core import semantics as sem\n"
        "import agentflow_core.semantics\n"
        "x = sem.N_ACTIONS + agentflow_core.semantics.TOKENS\n"
        "y = vocabulary.n_actions + vocabulary.tokens\n"
    )
    assert sorted(constant_reads(source)) == [(1, "OBS_DIM"), (4, "N_ACTIONS"), (4, "TOKENS")]


def test_no_module_outside_the_checkout_definition_reads_checkout_constants() -> None:
    modules = _modules()
    assert len(modules) > 100  # the scan sees the code base, not an empty glob
    offenders = [
        f"{path.relative_to(REPO)}:{line} {name}"
        for path in modules
        for line, name in constant_reads(path.read_text(encoding="utf-8"))
    ]
    assert offenders == [], "read the process's Vocabulary instead:\n" + "\n".join(offenders)
