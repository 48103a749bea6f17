"""A process declared as a state machine, reached over HTTP: the generic HTTP channel on the machine service.

``class_path: agentflow_core.envs.machine_http:MachineHttpEnv`` with the ``api`` adapter and ``spec:``
naming the same machine document as the simulator channel; optionally ``kwargs: {base_url: ...}`` (a
running :mod:`agentflow_core.envs.machine_service`, else the one this process starts) and ``client:``
(the HTTP client's settings, :mod:`agentflow_core.envs.http_channel`). The env registers the document
with the service (``PUT /machines/{id}``, the id being its content hash) and drives it through
:class:`~agentflow_core.envs.http_channel.HttpChannelEnv` with the channel document
:func:`channel_document` writes -- the same for every machine, only the machine's id filled in --
checking every request against the OpenAPI document the service generates from the machine.

The raw observation is the HTTP channel's exchange (status code, reply body, client envelope), read by
the ``api`` mapping: ``{"json_path": "$.record.verified", "equals": 1}``, ``{"status": 503}`` for a
dropped request, ``{"status": 409}`` for an inapplicable action. A native action is a request of the
generated document: ``{"type": "http", "method": "POST", "path": "/sessions/{session}/actions/VERIFY"}``
or ``{"type": "http", "operation": "VERIFY"}``. A reset with a seed opens the session with that seed,
so a seed fixes the same episode as on the simulator channel; ``info`` carries the step's ``cost``,
the episode's ``business_value`` and ``outcome`` from the reply, as the simulator's does.
"""

from __future__ import annotations

from collections.abc import Mapping
from http import HTTPStatus
from typing import Any

from agentflow_core.envs.base import INAPPLICABLE_REWARD, StepResult
from agentflow_core.envs.http_channel import HttpChannelEnv
from agentflow_core.envs.http_channel_spec import OperationTable, client_config, parse_request
from agentflow_core.envs.http_client import ResilientClient
from agentflow_core.envs.machine_service import machine_id, openapi_document, shared_service
from agentflow_core.envs.state_machine import StateMachineEnv, family_and_version
from agentflow_core.errors import ConfigError
from agentflow_core.semantics import Vocabulary

# The client's settings: a dropped request is the policy's to retry (no automatic re-send), and the
# breaker never opens on the machine's own faults (they are business events of the process here).
CLIENT = {"timeout_s": 5.0, "max_retries": 0, "failure_threshold": 1_000_000}
SESSION_PATH = "$.session.id"


def channel_document(document: Mapping[str, Any], client: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The HTTP channel's settings for a machine's service (module docstring): data, with the machine's id."""
    machine = machine_id(document)
    return {
        "openapi_url": f"/machines/{machine}/openapi.json",
        "client": {**CLIENT, **(client or {})},
        "reset": {
            "method": "POST",
            "path": f"/machines/{machine}/sessions",
            "body": {"scenario": "${scenario}", "seed": "${seed}"},
            "save": {"session": SESSION_PATH},
        },
        "reply": {
            "reward": "$.result.reward",
            "done": "$.result.done",
            "failure_reason": "$.error.code",
            "default_reward": INAPPLICABLE_REWARD,
        },
    }


class MachineHttpEnv:
    """Physical env: the machine of ``spec`` behind the machine service (see the module docstring)."""

    def __init__(
        self,
        scenario: Any,
        env_id: str,
        spec: Mapping[str, Any],
        base_url: str | None = None,
        client: Mapping[str, Any] | None = None,
    ) -> None:
        document = dict(spec)
        base_url = base_url or shared_service().url
        self.machine = machine_id(document)
        register = ResilientClient(base_url, client_config(CLIENT, "client"))
        try:
            reply = register.request("PUT", f"/machines/{self.machine}", document, faults=False)
        finally:
            register.close()
        if not reply.ok:
            raise RuntimeError(f"env {env_id}: the machine service refused the machine: {reply.status_code}")
        self.settings = channel_document(document, client)
        self.http = HttpChannelEnv(scenario, env_id, self.settings, base_url=base_url)
        self.scenario = scenario

    @classmethod
    def check_spec(cls, spec: Any, vocabulary: Vocabulary, source: str = "<machine>") -> None:
        """The machine document, checked as the simulator channel checks it."""
        StateMachineEnv.check_spec(spec, vocabulary, source)

    @classmethod
    def check_native(cls, spec: Mapping[str, Any], actions: Mapping[str, Any]) -> None:
        """Every mapped native action is a request of the OpenAPI document generated from the machine."""
        table = OperationTable.of(openapi_document(spec))
        for name, native in actions.items():
            if not isinstance(native, Mapping) or native.get("type") != "http":
                raise ValueError(f"{name}: got {native!r}, expected an http request of the machine's service")
            request = parse_request(native, name, table.by_id)
            if not table.declares(request.method, request.path):
                raise ValueError(
                    f"{name}: {request.method} {request.path} is not an operation of the machine's service"
                )

    @classmethod
    def raw_states(cls, spec: Mapping[str, Any], source: str = "<machine>") -> list[tuple[Any, str]]:
        """The machine's labelled audit states, as the exchanges the service would answer."""
        faults = {str(f.get("reason")) for f in spec.get("faults") or [] if isinstance(f, Mapping)}
        out = []
        for raw, token in StateMachineEnv.raw_states(spec, source):
            reason = raw["last"]["failure_reason"]
            status = 200 if reason is None else 503 if reason in faults else 409
            body = {
                "session": {"id": "audit", "step": 1, "status": "open"},
                "record": dict(raw["state"]),
                "result": {"applied": status != 409, "done": False, "outcome": None},
                "error": None if reason is None else {"code": reason, "message": reason},
            }
            client = {"retries": 0, "outcome": "ok" if status == 200 else "client_error", "breaker": "closed"}
            out.append(({"status_code": status, "json": body, "endpoint": "/sessions/audit", "client": client}, token))
        return out

    @property
    def env_id(self) -> str:
        """The variant's env id."""
        return self.http.env_id

    @property
    def family(self) -> str:
        """The env family (from the env id)."""
        return family_and_version(self.http.env_id)[0]

    @property
    def version(self) -> int:
        """The env version (from the env id)."""
        return family_and_version(self.http.env_id)[1]

    @property
    def max_steps(self) -> int:
        """The step limit of the current variant."""
        return int(self.scenario.max_episode_steps)

    def reconfigure(self, scenario: Any, env_id: str) -> None:
        """Re-target to another variant; the next reset opens a session for it."""
        self.scenario = scenario
        self.http.reconfigure(scenario, env_id)

    def reset(self, seed: int | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
        """Open a session: with ``seed``, the machine's generator is seeded by it (the simulator's episode)."""
        self._end_session()
        request = dict(self.settings["reset"])
        if seed is not None:
            request["body"] = {**request["body"], "seed": int(seed)}
        self.http.reset_request = parse_request(request, "reset")
        return self.http.reset(seed)

    def step(self, native_action: Mapping[str, Any]) -> StepResult:
        """Send the action's request; the reply's result fills the machine's step information."""
        result = self.http.step(native_action)
        body = result.obs.get("json") or {}
        outcome = body.get("result") if isinstance(body.get("result"), Mapping) else None
        if outcome is not None and result.obs.get("status_code") is not None:
            result.info.update(
                applied=bool(outcome.get("applied")),
                cost=float(outcome.get("cost") or 0.0),
                business_value=float(outcome.get("business_value") or 0.0),
                outcome=outcome.get("outcome") if result.terminated else ("truncated" if result.truncated else None),
            )
        return result

    def oracle_action(self) -> str:
        """The oracle's machine action in the session's state, asked of the service (evaluation only)."""
        session = self.http.saved.get("session")
        reply = self.http.client.request("GET", f"/sessions/{session}/oracle", faults=False)
        action = (reply.json or {}).get("action")
        if reply.status_code == HTTPStatus.UNPROCESSABLE_ENTITY:
            raise ConfigError(self.env_id, "oracle", None, "an oracle section (rules and fallback)")
        if not isinstance(session, str) or reply.status_code != HTTPStatus.OK or not isinstance(action, str):
            raise RuntimeError(f"env {self.env_id}: the machine service gave no oracle action ({reply.status_code})")
        return action

    def close(self) -> None:
        """End the open session and release the client's connections."""
        self._end_session()
        self.http.close()

    def _end_session(self) -> None:
        """Tell the service the last session is over (it would expire anyway): its memory stays bounded by the envs."""
        session = self.http.saved.pop("session", None)
        if isinstance(session, str):
            self.http.client.request("DELETE", f"/sessions/{session}", faults=False)
