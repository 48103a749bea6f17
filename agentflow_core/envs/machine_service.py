"""A process declared as a state machine, served over HTTP: one machine per session, JSON per action.

The business logic is the machine (:mod:`agentflow_core.envs.state_machine` runs it, one per session);
this module is only its HTTP form, generic for every machine. A real server on ``127.0.0.1``
(``ThreadingHTTPServer`` in a daemon thread, port 0 = a free port), started in-process by
:func:`shared_service` (entry point ``machine`` of the group ``agentflow.services``)::

    PUT    /machines/{machine}             the machine document (JSON); {machine} is its content id
    GET    /machines/{machine}/openapi.json  the OpenAPI document generated from the machine
    POST   /machines/{machine}/sessions    {"scenario": {...}, "seed": n} -> 201, a new session
    POST   /sessions/{session}/actions/{ACTION}   one machine action
    GET    /sessions/{session}             the session as it stands
    GET    /sessions/{session}/oracle      {"action": ...}: what the oracle (it reads the hidden state) does now
    DELETE /sessions/{session}             end it early

Every reply about a session carries it, with the visible variables nested under ``record``::

    {"session": {"id": "9f0c...", "step": 3, "status": "open"},
     "record": {"verified": 1.0, "price": 20.0},
     "result": {"applied": true, "reward": -0.11, "cost": 1.0, "business_value": -3.0, "done": false,
                "outcome": null},
     "error": {"code": "timeout", "message": "Timeout."}}

Status codes carry the step's kind: 200 applied, 409 an action inapplicable in this state (the
machine's reason in ``error.code``), 503 a fault of the machine fired (a dropped request: the
machine's fault reason in ``error.code``, the state as the fault left it), 404 an action the machine
does not have or a session that does not exist (expired, closed, never opened), 410 an action on a
session already at a terminal. The session id (128 random bits) is the caller's credential. A session
unused for ``session_ttl_s`` expires; at most ``MAX_SESSIONS`` live at once (the oldest evicted);
bodies over ``MAX_BODY_BYTES`` are refused unread (413); malformed requests get a 4xx JSON reply.
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
import secrets
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from http import HTTPStatus
from http.server import ThreadingHTTPServer
from typing import Any

from agentflow_core.envs.json_service import JsonRequestHandler, Refusal
from agentflow_core.envs.state_machine import NATIVE_TYPE, StateMachineEnv
from agentflow_core.errors import ConfigError

MAX_BODY_BYTES = 256 * 1024
MAX_SESSIONS = 4096
MAX_MACHINES = 256
DEFAULT_TTL_S = 600.0
SEED_LIMIT = 2**63
_ID = re.compile(r"^[0-9a-f]{16,64}$")
_ROUTES = (
    ("PUT", re.compile(r"^/machines/(?P<machine>[^/]+)$"), "register"),
    ("GET", re.compile(r"^/machines/(?P<machine>[^/]+)/openapi\.json$"), "openapi"),
    ("POST", re.compile(r"^/machines/(?P<machine>[^/]+)/sessions$"), "open"),
    ("POST", re.compile(r"^/sessions/(?P<session>[^/]+)/actions/(?P<action>[^/]+)$"), "act"),
    ("GET", re.compile(r"^/sessions/(?P<session>[^/]+)$"), "read"),
    ("GET", re.compile(r"^/sessions/(?P<session>[^/]+)/oracle$"), "oracle"),
    ("DELETE", re.compile(r"^/sessions/(?P<session>[^/]+)$"), "close"),
)


def machine_id(document: Mapping[str, Any]) -> str:
    """The content id of a machine document (the same document gives the same id on every host)."""
    return hashlib.sha256(json.dumps(document, sort_keys=True, separators=(",", ":")).encode()).hexdigest()[:32]


def reason_message(reason: str) -> str:
    """A failure reason as a sentence: ``offer_required`` -> ``Offer required.``"""
    return reason.replace("_", " ").capitalize() + "."


def action_path(action: str) -> str:
    """The path template of one machine action."""
    return "/sessions/{session}/actions/" + action


def openapi_document(document: Mapping[str, Any]) -> dict[str, Any]:
    """The OpenAPI 3 document of a machine's service: its session routes and one operation per action."""
    variables = document.get("variables") or {}
    visible = [name for name, item in variables.items() if not (item or {}).get("hidden", False)]
    session = {"name": "session", "in": "path", "required": True, "schema": {"type": "string"}}
    reply = {
        "description": "the session",
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Reply"}}},
    }
    paths: dict[str, Any] = {
        "/machines/{machine}/sessions": {
            "post": {
                "operationId": "openSession",
                "parameters": [{"name": "machine", "in": "path", "required": True, "schema": {"type": "string"}}],
                "requestBody": {"content": {"application/json": {"schema": {"$ref": "#/components/schemas/Open"}}}},
                "responses": {"201": reply},
            }
        },
        "/sessions/{session}": {
            "get": {"operationId": "readSession", "parameters": [session], "responses": {"200": reply}},
            "delete": {"operationId": "closeSession", "parameters": [session], "responses": {"200": reply}},
        },
    }
    for name, action in (document.get("actions") or {}).items():
        paths[action_path(name)] = {
            "post": {
                "operationId": name,
                "summary": f"apply {name} (cost: {(action or {}).get('cost', '0')})",
                "parameters": [session],
                "responses": {
                    "200": reply,
                    "409": {**reply, "description": "inapplicable in this state"},
                    "503": {**reply, "description": "the request was dropped (a fault)"},
                    "410": {"description": "the session is at a terminal"},
                },
            }
        }
    number = {"type": "number"}
    record = {"type": "object", "properties": {name: number for name in visible}}
    return {
        "openapi": "3.0.3",
        "info": {"title": str(document.get("description") or "state machine"), "version": machine_id(document)},
        "paths": paths,
        "components": {
            "schemas": {
                "Open": {"type": "object", "properties": {"scenario": {"type": "object"}, "seed": {"type": "integer"}}},
                "Reply": {
                    "type": "object",
                    "properties": {
                        "session": {"type": "object"},
                        "record": record,
                        "result": {"type": "object"},
                        "error": {"type": "object", "nullable": True},
                    },
                },
            }
        },
    }


@dataclass
class Session:
    """One live machine run."""

    env: StateMachineEnv
    faults: frozenset[str]
    lock: threading.Lock = field(default_factory=threading.Lock)
    touched: float = field(default_factory=time.monotonic)
    last: dict[str, Any] = field(default_factory=dict)


class MachineState:
    """The service's machines and sessions (thread-safe); the HTTP handler only parses and replies."""

    def __init__(self, session_ttl_s: float = DEFAULT_TTL_S) -> None:
        self.session_ttl_s = session_ttl_s
        self.machines: dict[str, dict[str, Any]] = {}
        self._sessions: dict[str, Session] = {}
        self._lock = threading.Lock()

    def register(self, machine: str, document: dict[str, Any]) -> dict[str, Any]:
        """Keep a machine document under its content id (the id must be the document's own)."""
        if machine != machine_id(document):
            raise Refusal(HTTPStatus.CONFLICT, "the machine id is not the document's content id")
        with self._lock:
            if machine not in self.machines and len(self.machines) >= MAX_MACHINES:
                self.machines.pop(next(iter(self.machines)))
            self.machines[machine] = document
        return {"machine": machine}

    def openapi(self, machine: str) -> dict[str, Any]:
        """The generated OpenAPI document of a registered machine."""
        return openapi_document(self._machine(machine))

    def open(self, machine: str, body: Mapping[str, Any]) -> dict[str, Any]:
        """Start a session from ``{"scenario": {...}, "seed": n}``: the machine's first state."""
        document = self._machine(machine)
        unknown = sorted(set(body) - {"scenario", "seed"})
        if unknown:
            raise Refusal(HTTPStatus.BAD_REQUEST, f"unknown field(s) {unknown}")
        seed, scenario = body.get("seed", 0), body.get("scenario", {})
        if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < SEED_LIMIT:
            raise Refusal(HTTPStatus.BAD_REQUEST, "seed: expected an integer in [0, 2**63)")
        if not isinstance(scenario, dict) or not all(isinstance(v, (str, int, float)) for v in scenario.values()):
            raise Refusal(HTTPStatus.BAD_REQUEST, "scenario: expected an object of numbers and strings")
        try:
            env = StateMachineEnv(scenario, f"machine_{machine[:8]}", document)
        except (TypeError, ValueError, ConfigError) as exc:
            raise Refusal(HTTPStatus.UNPROCESSABLE_ENTITY, str(exc)[:200]) from None
        env.reset(seed)
        faults = frozenset(f.reason for f in env.machine.faults if f.reason is not None)
        session_id = secrets.token_hex(16)
        session = Session(env, faults)
        session.last = {"applied": True, "reward": 0.0, "cost": 0.0, "business_value": 0.0, "done": False}
        session.last["outcome"] = None
        with self._lock:
            self._expire()
            while len(self._sessions) >= MAX_SESSIONS:
                self._sessions.pop(next(iter(self._sessions)))
            self._sessions[session_id] = session
        return self._body(session_id, session, None)

    def act(self, session_id: str, action: str) -> tuple[int, dict[str, Any]]:
        """Apply one machine action to the session; (status, body)."""
        session = self._session(session_id)
        with session.lock:
            env = session.env
            if action not in env.machine.actions:
                raise Refusal(HTTPStatus.NOT_FOUND, f"no action {action[:64]!r} in this machine")
            if env.done:
                raise Refusal(HTTPStatus.GONE, "the session is at a terminal")
            result = env.step({"type": NATIVE_TYPE, "action": action})
            info = result.info
            session.last = {
                "applied": bool(info["applied"]),
                "reward": result.reward,
                "cost": info["cost"],
                "business_value": info["business_value"],
                "done": result.terminated,
                "outcome": info["outcome"] if result.terminated else None,
            }
            reason = result.obs["last"]["failure_reason"]
            status = HTTPStatus.OK
            if reason in session.faults:
                status = HTTPStatus.SERVICE_UNAVAILABLE
            elif not info["applied"]:
                status = HTTPStatus.CONFLICT
            return status, self._body(session_id, session, reason)

    def read(self, session_id: str) -> dict[str, Any]:
        """The session as it stands."""
        session = self._session(session_id)
        with session.lock:
            return self._body(session_id, session, None)

    def oracle(self, session_id: str) -> dict[str, Any]:
        """The oracle's machine action in the session's state (evaluation only: it reads the hidden variables)."""
        session = self._session(session_id)
        with session.lock:
            try:
                return {"action": session.env.oracle_action()}
            except ConfigError:
                raise Refusal(HTTPStatus.UNPROCESSABLE_ENTITY, "the machine declares no oracle") from None

    def close(self, session_id: str) -> dict[str, Any]:
        """End a session early."""
        with self._lock:
            session = self._sessions.pop(session_id, None)
        if session is None:
            raise Refusal(HTTPStatus.NOT_FOUND, "no such session (closed, expired or never opened)")
        return {"session": {"id": session_id, "status": "closed"}}

    def __len__(self) -> int:
        return len(self._sessions)

    def _machine(self, machine: str) -> dict[str, Any]:
        with self._lock:
            document = self.machines.get(machine)
        if document is None:
            raise Refusal(HTTPStatus.NOT_FOUND, "no such machine (PUT its document first)")
        return document

    def _session(self, session_id: str) -> Session:
        with self._lock:
            self._expire()
            session = self._sessions.get(session_id)
            if session is None:
                raise Refusal(HTTPStatus.NOT_FOUND, "no such session (closed, expired or never opened)")
            session.touched = time.monotonic()
            return session

    def _expire(self) -> None:
        now = time.monotonic()
        for session_id in [k for k, s in self._sessions.items() if now - s.touched > self.session_ttl_s]:
            del self._sessions[session_id]

    @staticmethod
    def _body(session_id: str, session: Session, reason: str | None) -> dict[str, Any]:
        env = session.env
        return {
            "session": {"id": session_id, "step": env.step_id, "status": "closed" if env.done else "open"},
            "record": {name: env.values[name] for name in env.machine.visible},
            "result": dict(session.last),
            "error": None if reason is None else {"code": reason, "message": reason_message(reason)},
        }


class _Handler(JsonRequestHandler):
    server: _Server
    max_body_bytes = MAX_BODY_BYTES

    def _dispatch(self, method: str) -> None:
        try:
            self._reply(*self._route(method))
        except Refusal as exc:
            self._reply(exc.status, {"error": {"code": "refused", "message": exc.reason}})
        except Exception as exc:  # noqa: BLE001 - a machine that crashes (an undefined expression) answers 500, not a reset
            self._reply(HTTPStatus.INTERNAL_SERVER_ERROR, {"error": {"code": "crashed", "message": str(exc)[:200]}})

    def _route(self, method: str) -> tuple[int, dict[str, Any]]:
        path = self.path.split("?", 1)[0]
        state = self.server.state
        for verb, pattern, name in _ROUTES:
            match = pattern.match(path)
            if match is None or verb != method:
                continue
            key = match.groupdict()
            if "machine" in key and not _ID.match(key["machine"]):
                raise Refusal(HTTPStatus.NOT_FOUND, "no such machine")
            if name == "register":
                return HTTPStatus.OK, state.register(key["machine"], self._body())
            if name == "openapi":
                return HTTPStatus.OK, state.openapi(key["machine"])
            if name == "open":
                return HTTPStatus.CREATED, state.open(key["machine"], self._body())
            if name == "act":
                return state.act(key["session"], key["action"])
            if name == "oracle":
                return HTTPStatus.OK, state.oracle(key["session"])
            return HTTPStatus.OK, state.read(key["session"]) if name == "read" else state.close(key["session"])
        raise Refusal(HTTPStatus.NOT_FOUND, f"no route {method} {path[:80]}")

    def do_GET(self) -> None:  # noqa: D102 - stdlib hook
        self._dispatch("GET")

    def do_POST(self) -> None:  # noqa: D102 - stdlib hook
        self._dispatch("POST")

    def do_PUT(self) -> None:  # noqa: D102 - stdlib hook
        self._dispatch("PUT")

    def do_DELETE(self) -> None:  # noqa: D102 - stdlib hook
        self._dispatch("DELETE")


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address: tuple[str, int], state: MachineState) -> None:
        self.state = state
        super().__init__(address, _Handler)


class MachineService:
    """The machine service on ``127.0.0.1:port`` (0: a free port), served from a daemon thread."""

    def __init__(self, port: int = 0, session_ttl_s: float = DEFAULT_TTL_S) -> None:
        self.state = MachineState(session_ttl_s)
        self._server = _Server(("127.0.0.1", port), self.state)
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        """The base URL clients use."""
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def start(self) -> MachineService:
        """Serve in a daemon thread (idempotent)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._server.serve_forever, name="machine-service", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving and release the port."""
        if self._thread is not None:
            self._server.shutdown()
            self._thread.join()
            self._thread = None
        self._server.server_close()


@functools.cache
def shared_service() -> MachineService:
    """This process's machine service, started on first use (the ``agentflow.services`` entry point ``machine``)."""
    return MachineService().start()
