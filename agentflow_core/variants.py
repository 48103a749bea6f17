"""The variant catalogue: base envs × scenario dimensions × sampled perturbations, as data.

A variant is a base env plus overrides of its process's scenario fields (``params``; the fields, and which
are dimensions and perturbations, are declared by the process, :mod:`agentflow_core.scenario`). The catalogue is generated
deterministically from a seed (docs/design.md §3.3: ~7,000 variants from a handful of base envs), written
once as a Parquet table with a ``_meta.json`` card, and read back by the pool, which builds each
variant from its :class:`VariantSpec` alone (specs cross process boundaries as JSON, not objects).
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import itertools
import json
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from agentflow_core.atomic import atomic_dir
from agentflow_core.config import RangeSpec
from agentflow_core.envs.base import Scenario
from agentflow_core.errors import DATA_ERRORS, AgentFlowError, ConfigError, DataFileError
from agentflow_core.scenario import ScenarioSpec

CATALOGUE_FILE = "catalogue.parquet"
META_FILE = "_meta.json"
SCHEMA_VERSION = "1"
FIXED_COLUMNS = ("env_id", "base_env_id", "family", "content_hash", "params_json")

# Short, readable names for the env_id (docs/design.md §3.3: ``web_checkout_v2_net_packet_loss_5%``).
ID_ABBREVIATIONS = {
    "network": "net",
    "user_tier": "user",
    "start_stage": "stage",
    "price_factor": "price",
    "inventory": "inv",
    "balance": "bal",
    "card_decline_rate": "decline",
    "session_timeout_steps": "session",
    "max_episode_steps": "steps",
    "vip_discount": "vipdisc",
}
_FIELD_ORDER = {name: i for i, name in enumerate(f.name for f in fields(Scenario))}
_MAX_RESAMPLE_ROUNDS = 10_000


@dataclass(frozen=True)
class BaseEnvInfo:
    """What the generator needs to know about a registered base env."""

    base_env_id: str
    family: str
    version: int


@dataclass(frozen=True)
class VariantSpec:
    """One variant as plain data: enough to build its env in any process."""

    env_id: str
    base_env_id: str
    family: str
    params: dict[str, Any] = field(hash=False)
    content_hash: str

    def to_json(self) -> str:
        """Canonical JSON (sorted keys), so equal specs serialise to equal strings."""
        return json.dumps(
            {
                "env_id": self.env_id,
                "base_env_id": self.base_env_id,
                "family": self.family,
                "params": self.params,
                "content_hash": self.content_hash,
            },
            sort_keys=True,
            separators=(",", ":"),
        )

    @classmethod
    def from_json(cls, text: str) -> VariantSpec:
        """Inverse of :meth:`to_json`."""
        data = json.loads(text)
        return cls(
            env_id=data["env_id"],
            base_env_id=data["base_env_id"],
            family=data["family"],
            params=dict(data["params"]),
            content_hash=data["content_hash"],
        )

    def to_record(self) -> dict[str, Any]:
        """One catalogue row: the fixed columns plus one column per overridden parameter."""
        row: dict[str, Any] = {
            "env_id": self.env_id,
            "base_env_id": self.base_env_id,
            "family": self.family,
            "content_hash": self.content_hash,
            "params_json": canonical_json(self.params),
        }
        row.update(self.params)
        return row

    def scenario(self, defaults: Mapping[str, Any] | None = None) -> Scenario:
        """The variant's Scenario: ``defaults`` (the base env's params) with the overrides on top."""
        return Scenario.from_dict({**dict(defaults or {}), **self.params})


def canonical_json(value: Any) -> str:
    """Sorted-key, whitespace-free JSON: the form hashes are computed over."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def content_hash(base_env_id: str, params: Mapping[str, Any]) -> str:
    """First 16 hex digits of sha256 over the canonical JSON of (base_env_id, params)."""
    payload = canonical_json({"base_env_id": base_env_id, "params": dict(params)})
    return hashlib.sha256(payload.encode("utf-8")).hexdigest()[:16]


def stable_worker(env_id: str, n_workers: int) -> int:
    """Worker index for a variant; sha256-based, so every process agrees (``hash()`` is salted)."""
    if n_workers < 1:
        raise ValueError(f"n_workers must be >= 1, got {n_workers}")
    digest = hashlib.sha256(env_id.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") % n_workers


# --- validation ---------------------------------------------------------------------------------


def _to_python(value: Any) -> Any:
    """numpy scalars -> plain Python, so params serialise to JSON identically everywhere."""
    return value.item() if isinstance(value, np.generic) else value


def _check_value(key: str, field: str, value: Any, source: str, scenario: ScenarioSpec) -> None:
    """Reject a value the process's scenario field refuses, naming the config key and the value."""
    expected = scenario.field(field).problem(_to_python(value))
    if expected is not None:
        raise ConfigError(source, key, value, f"{expected} for scenario field {field!r}")


def _check_name(key: str, name: str, source: str, scenario: ScenarioSpec, role: str) -> None:
    if name not in scenario.names:
        raise ConfigError(source, key, name, f"a scenario field of the process, one of {list(scenario.names)}")
    declared = scenario.field(name).role
    if declared != role:
        allowed = list(scenario.with_role(role))  # type: ignore[arg-type]
        raise ConfigError(
            source, key, name, f"a field the process declares as a {role} ({allowed}; {name} is {declared})"
        )


def validate_generator(
    dimensions: Mapping[str, Sequence[Any]],
    perturbations: Mapping[str, RangeSpec],
    samples_per_combination: int,
    source: str = "params.yaml",
    *,
    scenario: ScenarioSpec,
) -> None:
    """Fail at load, naming the dimension/perturbation and value, before anything is generated.

    Dimensions and perturbations must be fields ``scenario`` (the process's) declares in that role.
    """
    for name, values in dimensions.items():
        key = f"variants.dimensions.{name}"
        _check_name(key, name, source, scenario, "dimension")
        if not values:
            raise ConfigError(source, key, values, "a non-empty list of values")
        if len(set(map(canonical_json, values))) != len(values):
            raise ConfigError(source, key, values, "distinct values")
        for value in values:
            _check_value(key, name, value, source, scenario)
    for name, spec in perturbations.items():
        key = f"variants.perturbations.{name}"
        if name in dimensions:
            raise ConfigError(source, key, name, "a field that is not also a dimension")
        _check_name(key, name, source, scenario, "perturbation")
        _check_range(key, name, spec, source, scenario)
    space = perturbation_space_size(perturbations)
    if samples_per_combination > space:
        raise ConfigError(
            source,
            "variants.samples_per_combination",
            samples_per_combination,
            f"at most {space}, the number of distinct perturbation draws",
        )


def _check_range(key: str, name: str, spec: RangeSpec, source: str, scenario: ScenarioSpec) -> None:
    if spec.kind == "choice":
        for value in spec.choices or []:
            _check_value(f"{key}.choices", name, value, source, scenario)
        return
    kind = scenario.field(name).type
    if spec.kind == "uniform" and kind != "float":
        raise ConfigError(source, f"{key}.kind", spec.kind, f"'int' or 'choice' for the {kind} field {name!r}")
    if spec.kind == "int" and kind not in ("int", "float"):
        raise ConfigError(source, f"{key}.kind", spec.kind, f"'choice' for the {kind} field {name!r}")
    for bound in ("low", "high"):
        value = getattr(spec, bound)
        if spec.kind == "int" and float(value).is_integer():
            value = int(value)
        _check_value(f"{key}.{bound}", name, value, source, scenario)


def perturbation_space_size(perturbations: Mapping[str, RangeSpec]) -> int:
    """How many distinct perturbation tuples exist (floats are drawn on a 0.01 grid)."""
    size = 1
    for spec in perturbations.values():
        if spec.kind == "choice":
            size *= len(set(map(canonical_json, spec.choices or [])))
        elif spec.kind == "int":
            size *= int(np.floor(spec.high)) - int(np.ceil(spec.low)) + 1  # type: ignore[arg-type]
        else:
            size *= int(round((spec.high - spec.low) * 100)) + 1  # type: ignore[operator]
    return size


# --- generation ---------------------------------------------------------------------------------


def _draw(rng: np.random.Generator, spec: RangeSpec, size: int) -> list[Any]:
    """Uniform floats on a 0.01 grid, inclusive integer ranges, or a uniform choice."""
    if spec.kind == "uniform":
        low, high = float(spec.low), float(spec.high)  # type: ignore[arg-type]
        return [float(v) for v in np.clip(np.round(rng.uniform(low, high, size), 2), low, high)]
    if spec.kind == "int":
        low_i, high_i = int(np.ceil(spec.low)), int(np.floor(spec.high))  # type: ignore[arg-type]
        return [int(v) for v in rng.integers(low_i, high_i, size=size, endpoint=True)]
    choices = list(spec.choices or [])
    return [_to_python(choices[i]) for i in rng.integers(0, len(choices), size=size)]


def _draw_unique(
    rng: np.random.Generator, perturbations: list[tuple[str, RangeSpec]], size: int
) -> list[dict[str, Any]]:
    """``size`` distinct perturbation dicts; duplicates are redrawn so every variant differs."""
    columns = {name: _draw(rng, spec, size) for name, spec in perturbations}
    rows = [{name: columns[name][i] for name, _ in perturbations} for i in range(size)]
    for _ in range(_MAX_RESAMPLE_ROUNDS):
        seen: set[str] = set()
        duplicates = []
        for i, row in enumerate(rows):
            key = canonical_json(row)
            if key in seen:
                duplicates.append(i)
            seen.add(key)
        if not duplicates:
            return rows
        redraw = {name: _draw(rng, spec, len(duplicates)) for name, spec in perturbations}
        for j, i in enumerate(duplicates):
            rows[i] = {name: redraw[name][j] for name, _ in perturbations}
    raise AgentFlowError(f"could not draw {size} distinct perturbations in {_MAX_RESAMPLE_ROUNDS} rounds")


def _format_value(value: Any) -> str:
    if isinstance(value, float):
        text = f"{value:.2f}" if round(value, 2) == value else format(value, "g")
    else:
        text = str(value)
    return text.replace("%", "pct").replace(" ", "_").replace("/", "_")


def readable_id(base_env_id: str, params: Mapping[str, Any]) -> str:
    """``web_checkout_v2_net_latency_500ms_user_vip_stage_checkout_price_0.92_inv_37``."""
    ordered = sorted(params, key=lambda name: _FIELD_ORDER.get(name, len(_FIELD_ORDER)))
    parts = [base_env_id] + [f"{ID_ABBREVIATIONS.get(name, name)}_{_format_value(params[name])}" for name in ordered]
    return "_".join(parts)


def _cells(
    base_envs: Sequence[BaseEnvInfo], dimensions: Mapping[str, Sequence[Any]]
) -> Iterator[tuple[BaseEnvInfo, dict[str, Any]]]:
    names = sorted(dimensions)
    for base in sorted(base_envs, key=lambda b: b.base_env_id):
        for combo in itertools.product(*(dimensions[name] for name in names)):
            yield base, {name: _to_python(value) for name, value in zip(names, combo, strict=True)}


def generate_variants(
    base_envs: Sequence[BaseEnvInfo],
    dimensions: Mapping[str, Sequence[Any]],
    perturbations: Mapping[str, RangeSpec],
    samples_per_combination: int,
    seed: int,
    *,
    source: str = "params.yaml",
    scenario: ScenarioSpec,
) -> list[VariantSpec]:
    """Cartesian product of base envs × dimensions, each with ``samples_per_combination`` draws.

    Deterministic for a seed and independent of the mappings' key order (names are sorted;
    base envs are sorted by id). Perturbations are distinct within a combination, so every
    variant has its own content hash. Bad names or values raise :class:`ConfigError` first.
    """
    if samples_per_combination < 1:
        raise ConfigError(source, "variants.samples_per_combination", samples_per_combination, "an integer >= 1")
    ids = [b.base_env_id for b in base_envs]
    if len(set(ids)) != len(ids):
        raise ConfigError(source, "variants.base_envs", ids, "distinct base env ids")
    validate_generator(dimensions, perturbations, samples_per_combination, source, scenario=scenario)
    rng = np.random.default_rng(seed)
    ordered_perturbations = sorted(perturbations.items())
    specs: list[VariantSpec] = []
    for base, cell in _cells(base_envs, dimensions):
        for drawn in _draw_unique(rng, ordered_perturbations, samples_per_combination):
            params = {**cell, **drawn}
            specs.append(
                VariantSpec(
                    readable_id(base.base_env_id, params),
                    base.base_env_id,
                    base.family,
                    params,
                    content_hash(base.base_env_id, params),
                )
            )
    return _deduplicate_ids(specs)


def _deduplicate_ids(specs: list[VariantSpec]) -> list[VariantSpec]:
    """Append a short content-hash suffix to readable ids that collide (rare: float formatting)."""
    counts = Counter(s.env_id for s in specs)
    return [
        s
        if counts[s.env_id] == 1
        else VariantSpec(f"{s.env_id}_{s.content_hash[:8]}", s.base_env_id, s.family, s.params, s.content_hash)
        for s in specs
    ]


# --- catalogue I/O ------------------------------------------------------------------------------


def catalogue_counts(variants: Sequence[VariantSpec], dimensions: Sequence[str] | None = None) -> dict[str, Any]:
    """Counts by family, base env and each dimension's value (the card's and CLI's summary).

    ``dimensions`` names the parameters to count; by default every parameter with at most 32
    distinct values (so continuous perturbations do not flood the card).
    """
    by_param: dict[str, Counter[str]] = {}
    for spec in variants:
        for name, value in spec.params.items():
            if dimensions is None or name in dimensions:
                by_param.setdefault(name, Counter())[_format_value(value)] += 1
    dimension_counts = {
        name: dict(sorted(c.items())) for name, c in sorted(by_param.items()) if dimensions is not None or len(c) <= 32
    }
    return {
        "total": len(variants),
        "by_family": dict(sorted(Counter(s.family for s in variants).items())),
        "by_base_env": dict(sorted(Counter(s.base_env_id for s in variants).items())),
        "by_dimension": dimension_counts,
    }


def _table(variants: Sequence[VariantSpec]) -> pa.Table:
    rows = [spec.to_record() for spec in variants]
    param_names = sorted(
        {name for spec in variants for name in spec.params}, key=lambda n: _FIELD_ORDER.get(n, len(_FIELD_ORDER))
    )
    columns = {name: [row.get(name) for row in rows] for name in (*FIXED_COLUMNS, *param_names)}
    return pa.table(columns)


def _sha256_file(path: Path) -> str:
    with path.open("rb") as fh:
        return hashlib.file_digest(fh, "sha256").hexdigest()


def _write_meta(path: Path, meta: Mapping[str, Any]) -> None:
    path.write_text(json.dumps(meta, indent=2, sort_keys=True, default=str) + "\n", encoding="utf-8")


def _dimension_names(meta: Mapping[str, Any]) -> list[str] | None:
    dimensions = meta.get("dimensions")
    return sorted(dimensions) if isinstance(dimensions, Mapping) else None


def write_catalogue(
    variants: Sequence[VariantSpec],
    out_dir: Path | str,
    meta: Mapping[str, Any],
    files: Mapping[str, str] | None = None,
) -> Path:
    """Write ``catalogue.parquet``, its ``_meta.json`` card and ``files`` (name -> text), atomically.

    Returns the parquet path. ``files`` carries what is versioned with the catalogue (its splits).

    Both files go to a temporary sibling directory that then replaces ``out_dir``, so a failure
    at any point leaves the previous catalogue (or nothing) -- never a half-written one.
    ``meta`` carries the generator parameters; counts, the catalogue's sha256, the schema and
    ``created_at`` are added here.
    """
    out_dir = Path(out_dir)
    with atomic_dir(out_dir) as tmp_dir:
        table = _table(variants)
        pq.write_table(table, tmp_dir / CATALOGUE_FILE)
        card = {
            **dict(meta),
            "schema_version": SCHEMA_VERSION,
            "counts": catalogue_counts(variants, _dimension_names(meta)),
            "catalogue_sha256": _sha256_file(tmp_dir / CATALOGUE_FILE),
            "schema": {f.name: str(f.type) for f in table.schema},
            "created_at": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        }
        _write_meta(tmp_dir / META_FILE, card)
        for name, text in (files or {}).items():
            (tmp_dir / name).write_text(text, encoding="utf-8")
    return out_dir / CATALOGUE_FILE


def read_catalogue(path: Path | str) -> list[VariantSpec]:
    """Read a catalogue (the parquet file or its directory); content hashes are re-checked."""
    path = Path(path)
    if path.is_dir():
        path = path / CATALOGUE_FILE
    try:
        rows = pq.read_table(path, columns=list(FIXED_COLUMNS)).to_pylist()
        parsed = [(row, json.loads(row["params_json"])) for row in rows]
    except (*DATA_ERRORS, pa.ArrowException) as exc:
        raise DataFileError(path, f"{type(exc).__name__}: {exc}") from None
    specs = []
    for row, params in parsed:
        if not isinstance(params, dict):
            raise DataFileError(path, f"variant {row['env_id']}: params_json is not an object")
        expected = content_hash(row["base_env_id"], params)
        if expected != row["content_hash"]:
            raise AgentFlowError(
                f"{path}: variant {row['env_id']}: content_hash {row['content_hash']} "
                f"does not match its params (expected {expected})"
            )
        specs.append(VariantSpec(row["env_id"], row["base_env_id"], row["family"], params, row["content_hash"]))
    return specs


def read_meta(path: Path | str) -> dict[str, Any]:
    """The ``_meta.json`` card of a catalogue directory."""
    file = Path(path) / META_FILE
    try:
        card = json.loads(file.read_text(encoding="utf-8"))
    except DATA_ERRORS as exc:
        raise DataFileError(file, f"{type(exc).__name__}: {exc}") from None
    if not isinstance(card, dict):
        raise DataFileError(file, "not a JSON object")
    return card
