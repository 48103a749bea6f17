"""Every width and name comes from the selected process's Vocabulary: no module reads checkout's constants.

``agentflow_core/semantics.py`` is the one place that spells the checkout vocabulary out (its module
constants and the ``CHECKOUT`` value built from them). Any other module of the product that imports one
of those constants, or reads it as ``semantics.NAME``, would size or name something after checkout
whatever process ``params.yaml`` selects; this scan (of the parsed source, not of text) finds it.

The ``CHECKOUT`` vocabulary itself is a value callers pass where they mean checkout. As a *default*
(a parameter's ``= CHECKOUT``, a class field's, a ``getattr(..., CHECKOUT)`` / ``.get(..., CHECKOUT)``
fallback) it would make a forgotten vocabulary silently checkout's; a second scan finds those outside
the few modules where checkout is what is meant.
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


# Modules where a CHECKOUT default is checkout meant, and why.
CHECKOUT_DEFAULTS_ALLOWED = {
    # the config's own default process is checkout (``process: checkout``): a config validated without a
    # loaded process (context) checks its token and feature names against that process
    "agentflow_core/config/base.py",
    # a benchmark of checkout's envs: its replaying env is checkout-wide by construction
    "benchmarks/semantic_overhead.py",
}


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


def _mentions_checkout(expr: ast.expr) -> bool:
    return any(isinstance(node, ast.Name) and node.id == "CHECKOUT" for node in ast.walk(expr))


def checkout_defaults(source: str) -> list[tuple[int, str]]:
    """(line, kind) of every parameter default, class field default or getattr/get fallback that reads CHECKOUT."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            defaults = [d for d in (*node.args.defaults, *node.args.kw_defaults) if d is not None]
            found += [(d.lineno, "parameter default") for d in defaults if _mentions_checkout(d)]
        elif isinstance(node, ast.ClassDef):
            for stmt in node.body:
                value = stmt.value if isinstance(stmt, (ast.AnnAssign, ast.Assign)) else None
                if value is not None and _mentions_checkout(value):
                    found.append((stmt.lineno, "field default"))
        elif isinstance(node, ast.Call) and node.args:
            func = node.func
            getattr_call = isinstance(func, ast.Name) and func.id == "getattr" and len(node.args) == 3
            get_call = isinstance(func, ast.Attribute) and func.attr == "get" and len(node.args) == 2
            if (getattr_call or get_call) and _mentions_checkout(node.args[-1]):
                found.append((node.lineno, "fallback"))
    return found


def test_the_default_scan_finds_each_form() -> None:
    source = (
        "def f(vocabulary: Vocabulary = CHECKOUT, *, scenario=CHECKOUT.scenario): ...\n"
        "class E:\n"
        "    vocabulary: Vocabulary = field(default=CHECKOUT)\n"
        "v = getattr(adapter, 'vocabulary', CHECKOUT)\n"
        "w = context.get('vocabulary', CHECKOUT)\n"
        "def g(vocabulary: Vocabulary, expert=process.expert()): return CHECKOUT\n"
    )
    assert sorted(checkout_defaults(source)) == [
        (1, "parameter default"),
        (1, "parameter default"),
        (3, "field default"),
        (4, "fallback"),
        (5, "fallback"),
    ]


def test_no_module_defaults_to_the_checkout_vocabulary() -> None:
    offenders = [
        f"{path.relative_to(REPO)}:{line} {kind}"
        for path in _modules()
        if str(path.relative_to(REPO)) not in CHECKOUT_DEFAULTS_ALLOWED
        for line, kind in checkout_defaults(path.read_text(encoding="utf-8"))
    ]
    assert offenders == [], "callers pass the process's vocabulary; a missing one is an error:\n" + "\n".join(offenders)
