"""A catastrophic mapping regex costs a bounded time: the ``regex`` engine plus a per-search timeout.

With Python's ``re``, ``(.*.*)*XQZ`` on a page text hangs the step (and, holding the GIL, the
whole pool); the ``regex`` package answers it at once, and a pattern it does backtrack on,
``(a|aa)+$``, stops at ``REGEX_TIMEOUT_S`` with a MappingError naming the rule. No wall-clock
assertion here (2-core CI): a regression hangs the test into pytest's timeout instead.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agentflow_core.adapters.web import WebAdapter
from agentflow_core.errors import MappingError

REPO = Path(__file__).resolve().parents[2]


def _adapter(pattern: str) -> WebAdapter:
    mapping = json.loads((REPO / "agentflow_core/mappings/web_checkout_v2.json").read_text())
    mapping["token_rules"][0]["when"] = {"text_regex": pattern}
    return WebAdapter(mapping, source="hostile.json")


def _page(text: str) -> dict[str, object]:
    return {"page": "cart", "text": text, "buttons": [], "links": [], "fields": {}, "forms": [], "banner": None}


def test_nested_star_pattern_from_the_issue_is_answered_at_once() -> None:
    adapter = _adapter("(.*.*)*XQZ")
    for _ in range(20):  # re.search would not return from the first of these
        assert adapter.adapt_observation(_page("Checkout: your cart holds 2 items. " * 40)) is not None


def test_a_backtracking_pattern_stops_at_the_timeout_naming_the_rule() -> None:
    adapter = _adapter("(a|aa)+$")
    with pytest.raises(MappingError, match=r"hostile\.json: at \$\.token_rules\[0\]\.when\.text_regex: .*ran past"):
        adapter.adapt_observation(_page("a" * 80 + "!"))
    assert adapter.adapt_observation(_page("no runs of that letter here")) is not None
