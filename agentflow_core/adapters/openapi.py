"""OpenAPI 3 -> (env config, ``api`` mapping): a new HTTP channel from its spec, no code.

The design's "environment template library" (docs/design.md §5.3): given an API description, propose the semantic
mapping that a person would otherwise write by hand, then let the mapping audit check it.

* **Actions** -- each operation is matched to a semantic action by the words of its
  ``operationId`` and path (``createSession`` / ``/session`` -> LOGIN, ``/payment/topup`` ->
  TOP_UP_FUNDS, ...) and its method; the request body is the documented example (or the
  required properties' examples/defaults). ``x-agentflow-action: <ACTION>`` on an operation
  overrides the guess. RETRY is always the client's re-send.
* **Tokens** -- documented response codes (401 -> LOGGED_OUT, 402 -> INSUFFICIENT_FUNDS, 404 ->
  PAGE_NOT_FOUND, 5xx -> SERVER_ERROR) and the enum values of status-like properties, read in
  the context of the object holding them (``order.status = expired`` -> ORDER_EXPIRED but
  ``session.status = expired`` -> SESSION_EXPIRED). ``x-agentflow-tokens: {value: [TOKENS]}`` on
  a property overrides the table. Transport outcomes (timeout, open breaker) are always mapped.
* **Features** -- numeric/boolean properties by name (``logged_in``, ``items``, ``list_price``,
  ...), scaled by ``1 / maximum`` where the spec documents a maximum;
  ``x-agentflow-feature: <feature>`` overrides.

The spec is read through ``openapi_spec`` (operations, refs, properties, the shape check); this
module holds the keyword tables and builds the mapping and the env config. The spec arrives as a
dict: YAML parsing happens at the CLI edge. The spec never chooses code: the generated env is
checkout's demo HTTP env (``DEFAULT_CLASS_PATH``) for checkout, the generic HTTP channel
(``HTTP_CHANNEL_CLASS_PATH``) for any other process, or an installed env the caller names, and a
spec whose ``x-agentflow-class-path`` names anything else is rejected. For the generic channel the
spec's top-level ``x-agentflow-channel`` says how an episode opens and how a reply reads (the
channel's ``reset``, ``headers``, ``reply``, ``client`` and ``audit``: data, written as the env
config's ``spec`` and checked by :meth:`~agentflow_core.envs.http_channel.HttpChannelEnv.check_spec`
when the config is loaded).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from agentflow_core.adapters.openapi_spec import (
    body_properties,
    check_shape,
    example_body,
    operations,
    resolve_ref,
    words_of,
)
from agentflow_core.adapters.schema import validate_mapping
from agentflow_core.envs.http_channel import CHANNEL_ANNOTATION
from agentflow_core.errors import MappingError
from agentflow_core.semantics import CHECKOUT, Vocabulary

DEFAULT_CLASS_PATH = "agentflow_core.envs.payment_api:PaymentAPIEnv"
HTTP_CHANNEL_CLASS_PATH = "agentflow_core.envs.http_channel:HttpChannelEnv"

# (action, methods, keywords) in priority order: the more specific operations come first.
ACTION_RULES: tuple[tuple[str, frozenset[str], frozenset[str]], ...] = (
    ("TOP_UP_FUNDS", frozenset({"POST", "PUT"}), frozenset({"topup", "fund", "funds", "deposit", "wallet"})),
    ("USE_BACKUP_CARD", frozenset({"POST", "PUT", "PATCH"}), frozenset({"card", "backup", "method"})),
    ("CANCEL_ORDER", frozenset({"POST", "DELETE"}), frozenset({"cancel", "cancellation"})),
    ("ESCALATE", frozenset({"POST"}), frozenset({"escalate", "escalation", "support", "ticket", "handoff"})),
    ("LOGIN", frozenset({"POST"}), frozenset({"login", "session", "signin", "auth", "token"})),
    ("CHECKOUT", frozenset({"POST"}), frozenset({"checkout"})),
    ("SUBMIT_PAYMENT", frozenset({"POST"}), frozenset({"pay", "payment", "payments", "charge"})),
    ("ENTER_PAYMENT", frozenset({"GET"}), frozenset({"pay", "payment", "payments"})),
    ("ADD_TO_CART", frozenset({"POST", "PUT"}), frozenset({"cart", "basket"})),
    ("REMOVE_FROM_CART", frozenset({"DELETE"}), frozenset({"cart", "basket"})),
    ("VIEW_PRODUCT", frozenset({"GET"}), frozenset({"product", "products", "item", "sku", "catalog"})),
)

# The object a status-like property belongs to, recognised by the words of its path.
CONTEXTS: dict[str, frozenset[str]] = {
    "session": frozenset({"session", "auth", "login", "user"}),
    "cart": frozenset({"cart", "basket"}),
    "order": frozenset({"order", "orders"}),
    "payment": frozenset({"payment", "charge", "transaction"}),
    "product": frozenset({"product", "item", "sku"}),
    "escalation": frozenset({"escalation", "ticket", "support"}),
}

# (context, enum value) -> tokens. Values are compared lower-cased.
ENUM_TOKENS: dict[tuple[str, str], tuple[str, ...]] = {
    ("session", "none"): ("LOGGED_OUT",),
    ("session", "anonymous"): ("LOGGED_OUT",),
    ("session", "logged_out"): ("LOGGED_OUT",),
    ("session", "active"): ("LOGGED_IN",),
    ("session", "logged_in"): ("LOGGED_IN",),
    ("session", "expired"): ("SESSION_EXPIRED", "LOGGED_OUT"),
    ("session", "blocked"): ("USER_BLOCKED",),
    ("session", "suspended"): ("USER_BLOCKED",),
    ("cart", "empty"): ("CART_EMPTY",),
    ("cart", "filled"): ("CART_FILLED",),
    ("cart", "non_empty"): ("CART_FILLED",),
    ("order", "pending"): ("CHECKOUT_STARTED", "ORDER_PENDING"),
    ("order", "paid"): ("PAYMENT_SUCCESS",),
    ("order", "cancelled"): ("ORDER_CANCELLED",),
    ("order", "canceled"): ("ORDER_CANCELLED",),
    ("order", "expired"): ("ORDER_EXPIRED",),
    ("payment", "form_loaded"): ("PAYMENT_PAGE",),
    ("payment", "requires_payment_method"): ("PAYMENT_PAGE",),
    ("payment", "captured"): ("PAYMENT_SUCCESS",),
    ("payment", "succeeded"): ("PAYMENT_SUCCESS",),
    ("payment", "declined"): ("INVALID_CARD",),
    ("payment", "failed"): ("PAYMENT_FAILED",),
    ("payment", "insufficient_funds"): ("INSUFFICIENT_FUNDS",),
    ("payment", "topped_up"): ("FUNDS_TOPPED_UP",),
    ("product", "in_stock"): ("PRODUCT_VIEWED",),
    ("product", "out_of_stock"): ("PRODUCT_VIEWED", "OUT_OF_STOCK"),
    ("escalation", "open"): ("ESCALATED",),
    ("escalation", "escalated"): ("ESCALATED",),
}
STATUS_PROPERTIES = frozenset({"status", "state"})
TIER_PROPERTIES = frozenset({"tier", "level", "segment"})

STATUS_TOKENS: dict[int, tuple[str, ...]] = {
    401: ("LOGGED_OUT",),
    402: ("INSUFFICIENT_FUNDS",),
    404: ("PAGE_NOT_FOUND",),
}

# feature -> property names that carry it
FEATURE_NAMES: dict[str, frozenset[str]] = {
    "user_logged_in": frozenset({"logged_in", "authenticated"}),
    "cart_items": frozenset({"items", "item_count", "quantity"}),
    "payment_page_loaded": frozenset({"form_loaded", "payment_page_loaded"}),
    "is_vip": frozenset({"is_vip", "vip"}),
    "price_factor": frozenset({"list_price", "price_factor"}),
    "balance_ratio": frozenset({"balance_ratio"}),
}
TRANSPORT_RULES: tuple[dict[str, Any], ...] = (
    {
        "id": "transport_timeout",
        "when": {"json_path": "@.client.outcome", "equals": "timeout"},
        "emit": ["NETWORK_TIMEOUT"],
        "note": "no answer within the client timeout",
    },
    {
        "id": "transport_circuit_open",
        "when": {"json_path": "@.client.outcome", "equals": "circuit_open"},
        "emit": ["SERVER_ERROR"],
        "note": "the client's circuit breaker refuses to send",
    },
)


def _context(path: tuple[str, ...]) -> str | None:
    for part in reversed(path[:-1]):
        words = words_of(part)
        for context, keywords in CONTEXTS.items():
            if words & keywords:
                return context
    return None


def _rule_id(*parts: str) -> str:
    return re.sub(r"[^a-z0-9_]+", "_", "_".join(parts).lower()).strip("_")


def _action_of(path: str, method: str, operation: Mapping[str, Any]) -> str | None:
    explicit = operation.get("x-agentflow-action")
    if explicit:
        return str(explicit) if explicit in CHECKOUT.actions else None
    if "{" in path:  # parameterised reads (order by id) are not a semantic action
        return None
    words = words_of(str(operation.get("operationId", ""))) | words_of(path)
    for action, methods, keywords in ACTION_RULES:
        if method in methods and words & keywords:
            return action
    return None


def _actions(spec: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    actions: dict[str, dict[str, Any]] = {}
    for path, method, operation in operations(spec):
        action = _action_of(path, method, operation)
        if action is None or action in actions:
            continue
        native: dict[str, Any] = {"type": "http", "method": method, "path": path}
        body = example_body(spec, operation)
        if body is not None:
            native["body"] = body
        elif method in ("POST", "PUT", "PATCH"):
            native["body"] = {}
        actions[action] = native
    actions["RETRY"] = {"type": "retry"}
    return {name: actions[name] for name in CHECKOUT.actions if name in actions}


def _status_rules(spec: Mapping[str, Any]) -> list[dict[str, Any]]:
    codes: dict[str, str] = {}
    for _, _, operation in operations(spec):
        for code, response in (operation.get("responses") or {}).items():
            resolved, _ = resolve_ref(spec, response)
            codes.setdefault(str(code).upper(), str(resolved.get("description", "")))
    rules: list[dict[str, Any]] = []
    for code in sorted(codes):
        if code.isdigit() and int(code) in STATUS_TOKENS:
            rules.append(
                {"id": f"status_{code}", "when": {"status": int(code)}, "emit": list(STATUS_TOKENS[int(code)])}
            )
        elif code == "403" and "block" in codes[code].lower():
            rules.append({"id": "status_403", "when": {"status": 403}, "emit": ["USER_BLOCKED"]})
    if any(c == "5XX" or (c.isdigit() and 500 <= int(c) <= 599) for c in codes):
        rules.append({"id": "status_5xx", "when": {"status_range": [500, 599]}, "emit": ["SERVER_ERROR"]})
    return rules


def _enum_rules(properties: Mapping[tuple[str, ...], dict[str, Any]]) -> list[dict[str, Any]]:
    rules: list[dict[str, Any]] = []
    for path, prop in properties.items():
        json_path = "$." + ".".join(path)
        overrides = prop.get("x-agentflow-tokens") or {}
        context = _context(path)
        for value in prop.get("enum") or ():
            if not isinstance(value, str):
                continue
            tokens = overrides.get(value)
            if tokens is None and path[-1] in STATUS_PROPERTIES and context is not None:
                tokens = ENUM_TOKENS.get((context, value.lower()))
            if tokens is None and path[-1] in TIER_PROPERTIES and value.lower() == "vip":
                tokens = ("VIP_USER",)
            if tokens:
                rules.append(
                    {
                        "id": _rule_id("enum", *path, value),
                        "when": {"json_path": json_path, "equals": value},
                        "emit": list(tokens),
                    }
                )
    return rules


def _feature_rule(feature: str, path: tuple[str, ...], prop: dict[str, Any]) -> dict[str, Any]:
    """The mapping rule reading ``feature`` from the response field at ``path``, scaled by its declared maximum."""
    rule: dict[str, Any] = {"id": _rule_id("f", feature), "feature": feature, "source": "$." + ".".join(path)}
    maximum = prop.get("maximum")
    if prop.get("type") != "boolean" and isinstance(maximum, (int, float)) and maximum > 0 and maximum != 1:
        rule["scale"] = 1.0 / float(maximum)
    return rule


def _feature_rules(properties: Mapping[tuple[str, ...], dict[str, Any]]) -> list[dict[str, Any]]:
    rules: dict[str, dict[str, Any]] = {}
    for path, prop in properties.items():
        if prop.get("type") not in ("number", "integer", "boolean"):
            continue
        feature = prop.get("x-agentflow-feature") or next(
            (f for f, names in FEATURE_NAMES.items() if path[-1] in names), None
        )
        if feature not in CHECKOUT.features or feature in rules:
            continue
        rules[feature] = _feature_rule(feature, path, prop)
    rules["retries_used"] = {
        "id": "f_retries_used",
        "feature": "retries_used",
        "source": "@.client.retries",
        "scale": 0.2,
    }
    return [rules[f] for f in CHECKOUT.features if f in rules]


def _declared_status_rules(spec: Mapping[str, Any]) -> list[dict[str, Any]]:
    """``x-agentflow-tokens: [TOKENS]`` on a documented response code -> one status rule per code."""
    codes: dict[int, list[str]] = {}
    for _, _, operation in operations(spec):
        for code, response in (operation.get("responses") or {}).items():
            resolved, _ = resolve_ref(spec, response)
            tokens = resolved.get("x-agentflow-tokens")
            if str(code).isdigit() and isinstance(tokens, list):
                codes.setdefault(int(code), [str(t) for t in tokens])
    return [{"id": f"status_{code}", "when": {"status": code}, "emit": codes[code]} for code in sorted(codes)]


def _declared_rules(properties: Mapping[tuple[str, ...], dict[str, Any]]) -> list[dict[str, Any]]:
    """``x-agentflow-tokens: {value: [TOKENS]}`` on enum or boolean properties (``"true"``/``"false"`` keys)."""
    rules: list[dict[str, Any]] = []
    for path, prop in properties.items():
        overrides = prop.get("x-agentflow-tokens")
        if not isinstance(overrides, Mapping):
            continue
        for value, tokens in overrides.items():
            match: Any = value
            if prop.get("type") == "boolean":
                match = str(value).lower() == "true"
            rules.append(
                {
                    "id": _rule_id("enum", *path, str(value)),
                    "when": {"json_path": "$." + ".".join(path), "equals": match},
                    "emit": [str(t) for t in tokens],
                }
            )
    return rules


def _declared_actions(spec: Mapping[str, Any], vocabulary: Vocabulary) -> dict[str, dict[str, Any]]:
    actions: dict[str, dict[str, Any]] = {}
    for path, method, operation in operations(spec):
        action = operation.get("x-agentflow-action")
        if action not in vocabulary.actions or action in actions:
            continue
        native: dict[str, Any] = {"type": "http", "method": method, "path": path}
        body = example_body(spec, operation)
        if body:
            native["body"] = body
        actions[str(action)] = native
    if "RETRY" in vocabulary.actions:
        actions["RETRY"] = {"type": "retry"}
    return {name: actions[name] for name in vocabulary.actions if name in actions}


def _declared_features(
    properties: Mapping[tuple[str, ...], dict[str, Any]], vocabulary: Vocabulary
) -> list[dict[str, Any]]:
    rules: dict[str, dict[str, Any]] = {}
    for path, prop in properties.items():
        feature = prop.get("x-agentflow-feature")
        if feature not in vocabulary.features or feature in rules:
            continue
        rules[feature] = _feature_rule(feature, path, prop)
    if "retries_used" in vocabulary.features:
        rules["retries_used"] = {
            "id": "f_retries_used",
            "feature": "retries_used",
            "source": "@.client.retries",
            "scale": 0.2,
        }
    return [rules[f] for f in vocabulary.features if f in rules]


def generate_process_mapping(
    spec: Mapping[str, Any], family: str, vocabulary: Vocabulary, version: int = 1
) -> dict[str, Any]:
    """The ``api`` mapping of a spec for a process other than checkout: only what the spec declares.

    The keyword tables above are checkout's words; for another process every action, token and
    feature comes from the spec's ``x-agentflow-*`` annotations, checked against its vocabulary.
    """
    properties = body_properties(spec)
    title = str((spec.get("info") or {}).get("title", family))
    mapping = {
        "family": family,
        "template": "api",
        "version": version,
        "description": f"generated from the OpenAPI spec {title!r} by agentflow_core.adapters.openapi",
        "token_rules": [*_declared_status_rules(spec), *_declared_rules(properties)],
        "feature_rules": _declared_features(properties, vocabulary),
        "actions": _declared_actions(spec, vocabulary),
    }
    return validate_mapping(mapping, f"<openapi:{title}>", expected_template="api", vocabulary=vocabulary)


def generate_mapping(spec: Mapping[str, Any], family: str, version: int = 1) -> dict[str, Any]:
    """The ``api`` mapping document proposed for a spec (validated before it is returned)."""
    properties = body_properties(spec)
    token_rules = [*_status_rules(spec), *_enum_rules(properties), *(dict(r) for r in TRANSPORT_RULES)]
    title = str((spec.get("info") or {}).get("title", family))
    mapping = {
        "family": family,
        "template": "api",
        "version": version,
        "description": f"generated from the OpenAPI spec {title!r} by agentflow_core.adapters.openapi",
        "token_rules": token_rules,
        "feature_rules": _feature_rules(properties),
        "actions": _actions(spec),
    }
    return validate_mapping(mapping, f"<openapi:{title}>", expected_template="api", vocabulary=CHECKOUT)


def generate_from_openapi(
    spec: Mapping[str, Any],
    family: str,
    version: int = 1,
    *,
    process: str,
    vocabulary: Vocabulary,
    class_path: str = DEFAULT_CLASS_PATH,
    base_url: str | None = None,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """(env config in the ``configs/envs/*.yaml`` shape, ``api`` mapping) for an OpenAPI 3 spec.

    ``process``/``vocabulary`` choose the business process the mapping speaks; ``class_path`` (the
    caller's choice -- an installed env, never the spec's) and ``base_url`` (the running service)
    go into the env config.
    """
    if not re.fullmatch(r"[a-z][a-z0-9_]*", family):
        raise MappingError("<openapi>", "$", f"family: got {family!r}, expected ^[a-z][a-z0-9_]*$")
    if not str(spec.get("openapi", "")).startswith("3"):
        raise MappingError("<openapi>", "$.openapi", f"got {spec.get('openapi')!r}, expected an OpenAPI 3.x document")
    declared = spec.get("x-agentflow-class-path", DEFAULT_CLASS_PATH)
    if declared not in (DEFAULT_CLASS_PATH, HTTP_CHANNEL_CLASS_PATH):
        # A spec is data from elsewhere: it never chooses which code runs. Another env class is
        # registered as an entry point (group ``agentflow.envs``) and named in the env config.
        raise MappingError(
            "<openapi>",
            "$.x-agentflow-class-path",
            f"got {str(declared)[:120]!r}; a spec never chooses code (generated envs use {DEFAULT_CLASS_PATH})",
        )
    check_shape(spec)
    try:
        if vocabulary == CHECKOUT:
            mapping = generate_mapping(spec, family, version)
        else:
            mapping = generate_process_mapping(spec, family, vocabulary, version)
    except (AttributeError, TypeError, KeyError, IndexError) as exc:  # a part deeper than check_shape reads
        raise MappingError("<openapi>", "$", f"unexpected structure: {type(exc).__name__}: {str(exc)[:160]}") from None
    info: Mapping[str, Any] = spec["info"] if isinstance(spec.get("info"), Mapping) else {}
    config: dict[str, Any] = {
        "env_id": f"{family}_v{version}",
        "process": process,
        "description": str(info.get("description") or info.get("title") or family).strip().splitlines()[0],
        "class_path": class_path,
        "adapter": "api",
        "mapping": f"{family}_v{version}.json",
        "params": vocabulary.scenario.defaults(),
    }
    if class_path == HTTP_CHANNEL_CLASS_PATH:
        channel = spec.get(CHANNEL_ANNOTATION)
        if not isinstance(channel, Mapping):
            raise MappingError(
                "<openapi>",
                f"$.{CHANNEL_ANNOTATION}",
                "the generic HTTP channel needs the spec to say how an episode "
                "opens and how a reply reads (reset, headers, reply, audit)",
            )
        config["spec"] = dict(channel)
        if base_url is not None:
            config["kwargs"] = {"base_url": base_url}
    elif base_url is not None:
        config["kwargs"] = {"server_url" if class_path == DEFAULT_CLASS_PATH else "base_url": base_url}
    return config, mapping
