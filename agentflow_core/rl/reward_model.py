"""An external reward model: a small deterministic scorer, its loopback HTTP service, and the client.

The service speaks one endpoint, ``POST /score`` with ``{"obs": [[...obs_dim floats...], ...]}``
answering ``{"scores": [...]}`` (plus ``GET /health``). The model is a fixed-weight MLP over the
encoded semantic vector of one process (its input width is the process's ``obs_dim``; ReLU between
layers; one layer = linear), loaded from a JSON or
safetensors weights file, so scores are reproducible across runs and machines.

The client sends ONE request per pool step (the whole batch), never one per env. Any failure --
timeout, refused connection, non-200 status, malformed or non-finite answer -- returns the
caller's fallback rewards for that batch and increments ``failures`` (by reason), so training
never stalls on the reward service and the failure rate is observable.
"""

from __future__ import annotations

import json
import math
import threading
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from agentflow_core.atomic import atomic_file, write_text
from agentflow_core.semantics import Vocabulary

MAX_BATCH = 65_536


@dataclass(frozen=True)
class MLPRewardModel:
    """``score(x) = W_L relu(... relu(x W_1 + b_1) ...) + b_L``, squeezed to one value per row."""

    weights: tuple[np.ndarray, ...]
    biases: tuple[np.ndarray, ...]

    def __post_init__(self) -> None:
        if not self.weights or len(self.weights) != len(self.biases):
            raise ValueError("reward model needs one bias per weight matrix and at least one layer")
        if self.weights[0].ndim != 2:
            raise ValueError(f"layer 0: weight {self.weights[0].shape} is not a matrix")
        width = self.obs_dim
        for i, (w, b) in enumerate(zip(self.weights, self.biases, strict=True)):
            if w.ndim != 2 or w.shape[0] != width or b.shape != (w.shape[1],):
                raise ValueError(f"layer {i}: weight {w.shape} / bias {b.shape} do not chain from width {width}")
            if not (np.isfinite(w).all() and np.isfinite(b).all()):
                raise ValueError(f"layer {i}: non-finite weights")
            width = w.shape[1]
        if width != 1:
            raise ValueError(f"the last layer must have one output, got {width}")

    @property
    def obs_dim(self) -> int:
        """The width of an observation the model scores (its first layer's input)."""
        return int(self.weights[0].shape[0])

    def score(self, obs: np.ndarray) -> np.ndarray:
        """Scores of a batch ``[N, obs_dim]`` as float32 ``[N]``."""
        x = np.asarray(obs, dtype=np.float64)
        for i, (w, b) in enumerate(zip(self.weights, self.biases, strict=True)):
            x = x @ w + b
            if i < len(self.weights) - 1:
                x = np.maximum(x, 0.0)
        return x[:, 0].astype(np.float32)

    @classmethod
    def from_token_rewards(cls, token_rewards: Mapping[str, float], vocabulary: Vocabulary) -> MLPRewardModel:
        """A linear model paying ``token_rewards[t]`` for each active token of ``vocabulary`` (a reference model)."""
        w = np.zeros((vocabulary.obs_dim, 1))
        index = vocabulary.token_index()
        for token, value in token_rewards.items():
            w[index[token], 0] = value
        return cls((w,), (np.zeros(1),))

    def to_dict(self) -> dict[str, Any]:
        """The plain-data form :meth:`save` writes for a ``.json`` path (no pickle on load)."""
        return {
            "layers": [
                {"weight": w.tolist(), "bias": b.tolist()} for w, b in zip(self.weights, self.biases, strict=True)
            ]
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> MLPRewardModel:
        """Rebuild a model from :meth:`to_dict` output."""
        layers = data["layers"]
        return cls(
            tuple(np.asarray(layer["weight"], dtype=np.float64) for layer in layers),
            tuple(np.asarray(layer["bias"], dtype=np.float64) for layer in layers),
        )

    def save(self, path: Path) -> None:
        """JSON for ``.json``, safetensors (``layer{i}.weight`` / ``layer{i}.bias``) otherwise."""
        path = Path(path)
        if path.suffix == ".json":
            write_text(path, json.dumps(self.to_dict()))
            return
        from safetensors.numpy import save_file

        tensors = {}
        for i, (w, b) in enumerate(zip(self.weights, self.biases, strict=True)):
            tensors[f"layer{i}.weight"], tensors[f"layer{i}.bias"] = w.astype(np.float32), b.astype(np.float32)
        with atomic_file(path) as tmp:
            save_file(tensors, str(tmp))

    @classmethod
    def load(cls, path: Path) -> MLPRewardModel:
        """Inverse of :meth:`save`; safetensors cannot execute code, JSON is plain data."""
        path = Path(path)
        if path.suffix == ".json":
            return cls.from_dict(json.loads(path.read_text()))
        from safetensors.numpy import load_file

        tensors = load_file(str(path))
        n = len(tensors) // 2
        return cls(
            tuple(tensors[f"layer{i}.weight"].astype(np.float64) for i in range(n)),
            tuple(tensors[f"layer{i}.bias"].astype(np.float64) for i in range(n)),
        )


def _parse_obs(body: bytes, obs_dim: int) -> np.ndarray:
    payload = json.loads(body)
    if not isinstance(payload, dict) or "obs" not in payload:
        raise ValueError('expected a JSON object {"obs": [[...], ...]}')
    obs = np.asarray(payload["obs"], dtype=np.float64)
    if obs.ndim != 2 or obs.shape[1] != obs_dim:
        raise ValueError(f"obs must have shape [N, {obs_dim}], got {list(obs.shape)}")
    if obs.shape[0] > MAX_BATCH:
        raise ValueError(f"batch of {obs.shape[0]} exceeds {MAX_BATCH}")
    if not np.isfinite(obs).all():
        raise ValueError("obs contains NaN/inf")
    return obs


class RewardModelServer:
    """Loopback HTTP reward-model service on ``127.0.0.1:<free port>`` in a background thread.

    ``latency_s`` adds a fixed server-side delay per request; it exists to exercise client
    timeouts (and to emulate a slow remote model), and is 0 by default.
    """

    def __init__(self, model: MLPRewardModel, host: str = "127.0.0.1", port: int = 0, latency_s: float = 0.0) -> None:
        self.model, self.latency_s = model, latency_s
        self.requests = 0
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
                return  # the stdlib logs to stderr; the core never prints

            def _reply(self, status: int, payload: dict[str, Any]) -> None:
                body = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self) -> None:
                if self.path == "/health":
                    self._reply(200, {"status": "ok", "obs_dim": server.model.obs_dim})
                else:
                    self._reply(404, {"error": f"no route {self.path}"})

            def do_POST(self) -> None:
                if self.path != "/score":
                    self._reply(404, {"error": f"no route {self.path}"})
                    return
                server.requests += 1
                try:
                    length = int(self.headers.get("Content-Length", "0"))
                    obs = _parse_obs(self.rfile.read(length), server.model.obs_dim)
                except (ValueError, TypeError) as exc:
                    self._reply(400, {"error": str(exc)})
                    return
                if server.latency_s > 0:
                    time.sleep(server.latency_s)
                self._reply(200, {"scores": server.model.score(obs).tolist()})

        self._httpd = ThreadingHTTPServer((host, port), Handler)
        self._httpd.daemon_threads = True
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        """Base URL of the bound socket (the real port when constructed with port 0)."""
        host, port = self._httpd.server_address[:2]
        return f"http://{host!s}:{port}" if isinstance(host, str) else f"http://{host.decode()}:{port}"

    def start(self) -> RewardModelServer:
        """Serve in a daemon thread (entering ``with`` calls it); returns self for chaining."""
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05}, name="reward-model", daemon=True
        )
        self._thread.start()
        return self

    def close(self) -> None:
        """Stop serving and release the port."""
        if self._thread is not None:
            self._httpd.shutdown()
            self._thread.join(timeout=5)
            self._thread = None
        self._httpd.server_close()

    def __enter__(self) -> RewardModelServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


class RewardModelClient:
    """Batched client with a timeout; on any failure returns the caller's fallback and counts it."""

    def __init__(self, url: str, timeout_s: float = 0.5) -> None:
        self.url = url.rstrip("/")
        self.timeout_s = timeout_s
        self.requests = 0
        self.failures = 0
        self.failure_reasons: Counter[str] = Counter()
        self.last_ok = True
        self._http = httpx.Client(timeout=httpx.Timeout(timeout_s))

    def score(self, obs: np.ndarray, fallback: Sequence[float] | np.ndarray) -> np.ndarray:
        """Scores for ``obs [N, obs_dim]`` in one request, or ``fallback`` ([N]) if the service fails."""
        obs = np.asarray(obs, dtype=np.float32)
        self.requests += 1
        reason = None
        try:
            response = self._http.post(f"{self.url}/score", json={"obs": obs.tolist()})
            if response.status_code != 200:
                reason = f"http_{response.status_code}"
            else:
                scores = np.asarray(response.json()["scores"], dtype=np.float32)
                if scores.shape != (len(obs),) or not np.isfinite(scores).all():
                    reason = "bad_response"
        except httpx.TimeoutException:
            reason = "timeout"
        except httpx.TransportError:
            reason = "unreachable"
        except (ValueError, KeyError, TypeError):
            reason = "bad_response"
        self.last_ok = reason is None
        if reason is not None:
            self.failures += 1
            self.failure_reasons[reason] += 1
            return np.asarray(fallback, dtype=np.float32)
        return scores

    @property
    def failure_rate(self) -> float:
        """Share of requests that fell back (NaN before the first request)."""
        return self.failures / self.requests if self.requests else math.nan

    def close(self) -> None:
        """Close the HTTP connection pool."""
        self._http.close()
