"""A process declared as a state machine, served as a web form: rendered pages in, button clicks out.

The business logic is the machine (:mod:`agentflow_core.envs.state_machine` runs it); this channel only
changes the raw form. ``class_path: agentflow_core.envs.machine_web:MachineWebEnv`` with the ``web``
adapter and ``spec:`` naming the same machine document as the simulator channel. The raw observation is
a DOM-like page, the shape :mod:`agentflow_core.adapters.web` reads::

    {"page": "form", "title": "Process", "text": "Verified: yes\\nPrice: 20\\nTimeout.",
     "fields": {"verified": "1", "price": "20"}, "buttons": ["#verify", "#find-plan"], "links": [],
     "forms": ["process"], "banner": {"kind": "error", "text": "Timeout."}, "data": {"step": 3}}

Every visible variable is a form field holding its value as text (``1``, ``20``, ``0.25``) and a line of
visible text; every machine action is a button (``FIND_PLAN`` -> ``#find-plan``), shown on every page so
the page never narrows the process's mask; the last step's failure reason is the error banner; the page
name is ``form`` until a terminal, then the terminal's outcome (``goal``, ``handled``...). A native action
is a UI event ``{"type": "click", "target": "#find-plan"}``; a click on no button of the page does
nothing but cost the step (failure reason ``unknown_action``). Hidden variables are never on the page.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from agentflow_core.envs.base import StepResult
from agentflow_core.envs.machine_form import MachineForm
from agentflow_core.envs.state_machine import NATIVE_TYPE, StateMachineEnv

FORM = "process"
RUNNING_PAGE = "form"
# the page's own keys: a variable of one of these names would be read as the page value, not its field
RESERVED_NAMES = frozenset({"page", "title", "text", "fields", "buttons", "links", "forms", "banner", "data"})


def button_id(action: str) -> str:
    """The button of a machine action: ``FIND_PLAN`` -> ``#find-plan``."""
    return "#" + action.lower().replace("_", "-")


def field_text(value: Any) -> str:
    """A variable's value as a form shows it: ``1`` for 1.0, ``0.25``, the exact float otherwise."""
    number = float(value)
    return str(int(number)) if number.is_integer() and abs(number) < 1e15 else repr(number)


def reason_text(reason: str) -> str:
    """A failure reason as the banner says it: ``offer_required`` -> ``Offer required.``"""
    return reason.replace("_", " ").capitalize() + "."


def render_page(
    state: Mapping[str, Any], reason: str | None, buttons: list[str], page: str = RUNNING_PAGE, step: int = 0
) -> dict[str, Any]:
    """The page of one business state (visible variables), the last failure reason and the action buttons."""
    fields = {name: field_text(value) for name, value in state.items()}
    lines = [f"{name.replace('_', ' ').capitalize()}: {text}" for name, text in fields.items()]
    banner = None if reason is None else {"kind": "error", "text": reason_text(reason)}
    if banner is not None:
        lines.append(banner["text"])
    return {
        "page": page,
        "title": "Process" if page == RUNNING_PAGE else page.replace("_", " ").capitalize(),
        "text": "\n".join(lines),
        "fields": fields,
        "buttons": list(buttons),
        "links": [],
        "forms": [FORM],
        "banner": banner,
        "data": {"step": step},
    }


class MachineWebEnv(MachineForm):
    """Physical env: the machine of ``spec`` behind a rendered form (see the module docstring)."""

    def __init__(self, scenario: Any, env_id: str, spec: Mapping[str, Any], source: str = "<machine>") -> None:
        super().__init__(scenario, env_id, spec, source)
        self.actions = {button_id(name): name for name in spec.get("actions") or {}}
        self.buttons = sorted(self.actions)

    @classmethod
    def check_native(cls, spec: Mapping[str, Any], actions: Mapping[str, Any]) -> None:
        """Every mapped native action clicks the button of one of the machine's actions."""
        buttons = sorted(button_id(name) for name in spec.get("actions") or {})
        for semantic, native in actions.items():
            if not isinstance(native, Mapping) or native.get("type") != "click" or native.get("target") not in buttons:
                raise ValueError(f"{semantic}: got {native!r}, expected {{type: click, target: one of {buttons[:8]}}}")

    @classmethod
    def raw_states(cls, spec: Mapping[str, Any], source: str = "<machine>") -> list[tuple[Any, str]]:
        """The machine's labelled audit states, rendered as pages."""
        buttons = sorted(button_id(name) for name in spec.get("actions") or {})
        return [
            (render_page(raw["state"], raw["last"]["failure_reason"], buttons), token)
            for raw, token in StateMachineEnv.raw_states(spec, source)
        ]

    def reset(self, seed: int | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
        """Open the form on a fresh episode of the machine."""
        obs, info = self.sim.reset(seed)
        return render_page(obs["state"], None, self.buttons), info

    def step(self, native_action: Mapping[str, Any]) -> StepResult:
        """Click a button: the machine applies its action; the next page shows the new state."""
        target = native_action.get("target") if native_action.get("type") == "click" else None
        action = self.actions.get(target) if isinstance(target, str) else None
        result = self.sim.step({"type": NATIVE_TYPE, "action": action})
        outcome = result.info.get("outcome") if result.terminated else None
        reason = result.obs["last"]["failure_reason"]
        page = render_page(result.obs["state"], reason, self.buttons, outcome or RUNNING_PAGE, result.info["step_id"])
        return StepResult(page, result.reward, result.terminated, result.truncated, result.info)

    def close(self) -> None:
        """Nothing to release: the machine lives in memory."""
        self.sim.close()
