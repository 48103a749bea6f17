"""A catastrophic mapping regex costs a bounded time: the ``regex`` engine plus a per-search timeout.

With Python's ``re``, ``(.*.*)*XQZ`` on a page text hangs the step (and, holding the GIL, the
whole pool); the ``regex`` package answers it at once, and a pattern it does backtrack on,
``(a|aa)+$``, stops at ``REGEX_TIMEOUT_S`` with a MappingError naming the rule. Each costs at
most one step timeout (the pool's default, 5 s: a hundred times the 0.05 s search bound, so a loaded
2-core CI does not trip it) and leaves no thread or process behind: the search runs on the
calling thread. Compiling is bounded before it starts: a pattern whose counted repetition would
unroll into millions of nodes (``regex`` unrolls nested ``{m,n}``) is refused with the rule's path.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psutil
import pytest

from agentflow_core.adapters.regex_bound import check_regex, regex_cost
from agentflow_core.adapters.web import WebAdapter
from agentflow_core.config import PoolConfig
from agentflow_core.errors import MappingError
from agentflow_core.semantics import CHECKOUT

REPO = Path(__file__).resolve().parents[2]


def _adapter(pattern: str) -> WebAdapter:
    mapping = json.loads((REPO / "agentflow_core/mappings/web_checkout_v2.json").read_text())
    mapping["token_rules"][0]["when"] = {"text_regex": pattern}
    return WebAdapter(mapping, source="hostile.json", vocabulary=CHECKOUT)


def _page(text: str) -> dict[str, object]:
    return {"page": "cart", "text": text, "buttons": [], "links": [], "fields": {}, "forms": [], "banner": None}


@contextmanager
def within_one_step_timeout() -> Iterator[None]:
    """The block takes less than the pool's default step timeout and starts no thread or process."""
    threads = {thread.ident for thread in threading.enumerate()}
    children = {child.pid for child in psutil.Process().children(recursive=True)}
    started = time.perf_counter()
    yield
    assert time.perf_counter() - started < PoolConfig().step_timeout_s
    # Threads or processes an earlier test left behind may end meanwhile; none may begin.
    assert {thread.ident for thread in threading.enumerate()} <= threads
    assert {child.pid for child in psutil.Process().children(recursive=True)} <= children


def test_nested_star_pattern_from_the_issue_is_answered_at_once() -> None:
    adapter = _adapter("(.*.*)*XQZ")
    with within_one_step_timeout():
        for _ in range(20):  # re.search would not return from the first of these
            assert adapter.adapt_observation(_page("Checkout: your cart holds 2 items. " * 40)) is not None


def test_a_backtracking_pattern_stops_at_the_timeout_naming_the_rule() -> None:
    adapter = _adapter("(a|aa)+$")
    with (
        within_one_step_timeout(),
        pytest.raises(MappingError, match=r"hostile\.json: at \$\.token_rules\[0\]\.when\.text_regex: .*ran past"),
    ):
        adapter.adapt_observation(_page("a" * 80 + "!"))
    assert adapter.adapt_observation(_page("no runs of that letter here")) is not None


@pytest.mark.parametrize(
    ("pattern", "reason"),
    [
        ("(?:(?:a{999}){999}){999}", "unrolls to about"),
        ("((a{100}){100}){100}", "unrolls to about"),
        ("(x{5,}){9999}", "unrolls to about"),
        ("(" * 40 + "a" + ")" * 40, "nested 40 deep"),
        ("(?x)a # comment", "verbose"),
        ("a" * 1001, "longer than"),
    ],
)
def test_a_pattern_that_would_compile_large_is_refused_before_compiling(pattern: str, reason: str) -> None:
    started = time.perf_counter()
    with pytest.raises(MappingError, match=r"text_regex: .*" + reason):
        _adapter(pattern)
    assert time.perf_counter() - started < 0.5


@pytest.mark.parametrize(
    "pattern",
    [r"\d{16}", r"(?i)total:\s*\$\d{1,6}\.\d{2}", "[{]{5}x{,5}", r"\p{L}{3}", ".{0,100}x.{0,100}", "(x{200}){100}"],
)
def test_ordinary_counted_patterns_still_compile(pattern: str) -> None:
    assert check_regex(pattern) is None
    assert _adapter(pattern).adapt_observation(_page("total: $12.50")) is not None


def test_the_estimate_counts_groups_classes_and_escapes() -> None:
    assert regex_cost("ab") == (2, 0)
    assert regex_cost("(ab){3}") == (6, 1)
    assert regex_cost("[(]{4}") == (4, 0)  # a parenthesis inside a class opens no group
    assert regex_cost(r"\({4}") == (4, 0)
    assert regex_cost("(a(b){2}){3}") == (9, 2)
    assert regex_cost("a{x}") == (4, 0)  # not a quantifier: literal text
