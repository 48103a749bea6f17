"""Loopback control endpoints of the test store: reset to a scenario, read the placed order.

Both answer JSON under ``/__agentflow__/`` and only to the loopback address: they are how the generic
browser channel starts each episode from a known state and judges success from Oscar's own database
(not from the page text). The store's pages are Oscar's, unchanged.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

from django.db import transaction
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_GET, require_POST

from agentflow_oscar import store

_lock = threading.Lock()
_state: dict[str, Any] = {"scenario": {}}
LOOPBACK = ("127.0.0.1", "::1")


def configure(template: Path, live_db: Path) -> None:
    """Tell the endpoints which template restores which live database (called once by the server)."""
    _state["template"], _state["live_db"] = template, live_db


def _refused(request: HttpRequest) -> HttpResponse | None:
    if request.META.get("REMOTE_ADDR") not in LOOPBACK or "template" not in _state:
        return HttpResponse(status=403)
    return None


def posted_object(request: HttpRequest) -> dict[str, Any] | HttpResponse:
    """The posted JSON object of a loopback request, or the refusal to answer with (403, or 400 naming why)."""
    refused = _refused(request)
    if refused is not None:
        return refused
    try:
        body = json.loads(request.body or b"{}")
    except json.JSONDecodeError as exc:
        return JsonResponse({"error": f"invalid JSON: {exc}"}, status=400)
    if not isinstance(body, dict):
        return JsonResponse({"error": "expected a JSON object"}, status=400)
    return body


@csrf_exempt
@transaction.non_atomic_requests  # it closes the connection to replace the file under it
@require_POST
def reset(request: HttpRequest) -> HttpResponse:
    """Restore the template database, then apply the posted scenario (JSON object)."""
    scenario = posted_object(request)
    if isinstance(scenario, HttpResponse):
        return scenario
    with _lock:
        store.restore(_state["template"], _state["live_db"])
        with transaction.atomic():
            store.apply_scenario(scenario)
        _state["scenario"] = scenario
    return JsonResponse({"reset": True})


@require_GET
def order(request: HttpRequest) -> HttpResponse:
    """The customer's last order from Oscar's tables, checked against the scenario's catalogue prices."""
    refused = _refused(request)
    if refused is not None:
        return refused
    return JsonResponse(store.placed_order(_state["scenario"]))
