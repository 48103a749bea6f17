"""Every config reader, fuzzed: any YAML/JSON/regex text ends within 2 s and 300 MB, as a value or one known error.

The readers are the ones a user's file reaches: the limited YAML loader itself, ``--set`` values,
params files, env registry files (YAML and JSON), process files, OpenAPI specs, mapping regexes,
checkpoint state and pointer files. Inputs are drawn from tokens that build the hostile shapes
(anchors and aliases, recursive ones included, merge keys, flow and block nesting, tags, long
integers; for regexes groups and counted repetition), so a few hundred cases reach them. Each case
runs under a wall-clock alarm (a Python-level loop is interrupted at the budget instead of hanging
the suite) and ``tracemalloc`` (peak of Python and C-extension allocations). Anything raised must be
one of the project's one-line errors; ``derandomize`` keeps CI reproducible.
"""

from __future__ import annotations

import copy
import json
import signal
import time
import tracemalloc
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from agentflow_core.adapters.openapi import generate_from_openapi
from agentflow_core.adapters.web import WebAdapter
from agentflow_core.errors import AgentFlowError
from agentflow_core.registry import load_entry, load_mapping
from agentflow_core.rl.checkpoint import STATE_FILE, load_intact
from agentflow_core.semantics import CHECKOUT
from tasks.config_io import load_config
from tasks.overrides import parse_set
from tasks.process_io import read_process
from tasks.registry_io import yaml_load
from tasks.yaml_io import YamlLimitError, load_yaml_text

REPO = Path(__file__).resolve().parents[2]
BUDGET_S = 2.0
BUDGET_BYTES = 300 << 20
# The project's one-line errors (the CLI prints them as one line and exits 2).
KNOWN = (YamlLimitError, AgentFlowError)

RECURSIVE = "x: &a [*a]"  # the 12 bytes that once hung every YAML reader
DEEP_JSON = "[" * 3000 + "]" * 3000
YAML_TOKENS = [
    *("&a ", "&b ", "*a", "*b", "<<: ", "[", "]", "{", "}", ", ", ": ", "- ", "\n", "  ", "? ", "|\n", ">\n"),
    *("x", "k", "base", "train", "seed", "paths", "1", "-1.5", ".inf", ".nan", "9" * 70, "null", "true"),
    *("!!python/name:os.system ", "!!binary ", "!!set ", "!!omap ", "'q'", '"\\u0000"', "#c", "---\n", "...\n"),
]
JSON_TOKENS = ["[", "]", "{", "}", ", ", ": ", '"k"', '"token_rules"', "1", "1e999", "-0", "null", "true", '"\\ud800"']
REGEX_TOKENS = [
    *("(", ")", "(?:", "(?i)", "(?r)", "(?>", "|", "*", "+", "?", "*?", "{999}", "{2,}", "{,50}", "{1,99}", "{e<=2}"),
    *("a", "aa", ".", ".*", r"\d", r"\w+", "[a-z]", "[^]]", r"\p{L}", "^", "$", r"\b", "(?=a)", r"\1", "{", "}"),
]


def _joined(tokens: list[str], max_size: int) -> st.SearchStrategy[str]:
    return st.lists(st.sampled_from(tokens), max_size=max_size).map("".join)


YAML_TEXT = st.one_of(_joined(YAML_TOKENS, 40), st.text(max_size=60))
JSON_TEXT = st.one_of(_joined(JSON_TOKENS, 60), st.text(max_size=40))
REGEX_TEXT = st.one_of(_joined(REGEX_TOKENS, 30), st.text(min_size=1, max_size=30))
FUZZ = settings(
    max_examples=120,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


class _OverBudget(Exception):
    pass


def _alarm(signum: int, frame: object) -> None:
    raise _OverBudget(f"past {BUDGET_S} s")


@contextmanager
def within_budget() -> Iterator[None]:
    """The block ends within ``BUDGET_S`` and allocates at most ``BUDGET_BYTES`` at its peak."""
    previous = signal.signal(signal.SIGALRM, _alarm)
    tracemalloc.start()
    started = time.perf_counter()
    signal.setitimer(signal.ITIMER_REAL, BUDGET_S + 0.5)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    seconds = time.perf_counter() - started
    assert seconds <= BUDGET_S, f"{seconds:.2f} s"
    assert peak <= BUDGET_BYTES, f"{peak >> 20} MB"


def _run(reader: Callable[[], Any]) -> None:
    with within_budget(), suppress(*KNOWN):
        reader()


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8", errors="surrogatepass")
    return path


@pytest.fixture(scope="module")
def web_mapping() -> dict[str, Any]:
    """The shipped web mapping, read once; each case changes one rule's regex in a copy."""
    return json.loads((REPO / "agentflow_core/mappings/web_checkout_v2.json").read_text())


@FUZZ
@given(text=YAML_TEXT)
@example(text=RECURSIVE)
def test_yaml_loader_and_set_values(text: str) -> None:
    _run(lambda: load_yaml_text(text))
    _run(lambda: parse_set([f"train.total_steps={text}"]))


@FUZZ
@given(text=YAML_TEXT)
@example(text=RECURSIVE)
def test_params_files(text: str, tmp_path: Path) -> None:
    _run(lambda: load_config(_write(tmp_path / "params.yaml", text)))


@FUZZ
@given(text=YAML_TEXT, json_text=JSON_TEXT)
@example(text=RECURSIVE, json_text=DEEP_JSON)
def test_registry_files_and_mappings(text: str, json_text: str, tmp_path: Path) -> None:
    _run(lambda: load_entry(_write(tmp_path / "envs/shop.yaml", text), yaml_load))
    _run(lambda: load_mapping(_write(tmp_path / "envs/shop.json", json_text), yaml_load))
    _run(lambda: load_mapping(_write(tmp_path / "envs/shop_map.yaml", text), yaml_load))


@FUZZ
@given(text=YAML_TEXT)
@example(text=RECURSIVE)
def test_process_files(text: str, tmp_path: Path) -> None:
    _run(lambda: read_process(_write(tmp_path / "processes/evil.yaml", text)))


@FUZZ
@given(text=YAML_TEXT)
@example(text=RECURSIVE)
def test_openapi_specs(text: str) -> None:
    def read() -> None:
        document = load_yaml_text(text)
        if isinstance(document, dict):
            generate_from_openapi(document, "shop", process="checkout", vocabulary=CHECKOUT)

    _run(read)


OPENAPI_KEYS = ["paths", "/pay", "post", "get", "responses", "200", "requestBody", "content", "application/json"]
OPENAPI_KEYS += ["schema", "properties", "status", "enum", "example", "$ref", "components", "schemas", "required"]
OPENAPI_LEAVES = st.one_of(st.none(), st.integers(), st.text(max_size=8), st.sampled_from(["#/components/schemas/x"]))
OPENAPI_TREES = st.recursive(
    OPENAPI_LEAVES,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.sampled_from(OPENAPI_KEYS), inner, max_size=4)
    ),
    max_leaves=24,
)


@FUZZ
@given(paths=OPENAPI_TREES, components=OPENAPI_TREES)
@example(paths=["/pay"], components=None)
def test_openapi_structures(paths: Any, components: Any) -> None:
    _run(
        lambda: generate_from_openapi(
            {"openapi": "3.0.0", "paths": paths, "components": components},
            "shop",
            process="checkout",
            vocabulary=CHECKOUT,
        )
    )


@FUZZ
@given(pattern=REGEX_TEXT)
@example(pattern="(?:(?:a{999}){999}){999}")
def test_mapping_regexes(pattern: str, web_mapping: dict[str, Any]) -> None:
    mapping = copy.deepcopy(web_mapping)
    mapping["token_rules"][0]["when"] = {"text_regex": pattern}
    page = {"page": "cart", "text": "Checkout: your cart holds 2 items. " * 40 + "a" * 60 + "!"}

    def read() -> None:
        WebAdapter(mapping, source="fuzz.json", vocabulary=CHECKOUT).adapt_observation(
            {**page, "buttons": [], "links": [], "fields": {}, "forms": [], "banner": None}
        )

    _run(read)


@FUZZ
@given(state=JSON_TEXT, pointer=JSON_TEXT)
@example(state=DEEP_JSON, pointer=DEEP_JSON)
def test_checkpoint_state_and_pointer_files(state: str, pointer: str, tmp_path: Path) -> None:
    root = tmp_path / "ckpts"
    _write(root / "update_00000001" / STATE_FILE, state)
    _write(root / "latest.json", pointer)
    _run(lambda: load_intact(root, vocabulary=CHECKOUT))
