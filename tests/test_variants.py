"""Variant catalogue: determinism, round-trips, readable unique ids, validation, atomic writes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

import agentflow_core.variants as variants_mod
from agentflow_core.config import RangeSpec, VariantsConfig
from agentflow_core.envs.base import Scenario
from agentflow_core.errors import ConfigError
from agentflow_core.semantics import CHECKOUT
from agentflow_core.variants import (
    BaseEnvInfo,
    VariantSpec,
    content_hash,
    generate_variants,
    read_catalogue,
    read_meta,
    readable_id,
    stable_worker,
    write_catalogue,
)
from tasks.context import PhaseContext

BASES = [
    BaseEnvInfo("web_checkout_v2", "web_checkout", 2),
    BaseEnvInfo("order_db_v1", "order_db", 1),
    BaseEnvInfo("payment_api_v1", "payment_api", 1),
]
SMALL_DIMS = {"network": ["normal", "packet_loss_5%"], "user_tier": ["standard", "vip"]}
SMALL_PERTURB = {
    "price_factor": RangeSpec(kind="uniform", low=0.85, high=1.15),
    "inventory": RangeSpec(kind="int", low=0, high=100),
}


def small(seed: int = 0, dims: dict | None = None, perturb: dict | None = None, samples: int = 5) -> list[VariantSpec]:
    return generate_variants(
        BASES,
        dims or SMALL_DIMS,
        SMALL_PERTURB if perturb is None else perturb,
        samples,
        seed,
        scenario=CHECKOUT.scenario,
    )


def test_deterministic_for_a_seed_and_different_for_another() -> None:
    assert small(seed=7) == small(seed=7)
    assert [v.params for v in small(seed=7)] != [v.params for v in small(seed=8)]


def test_independent_of_mapping_and_base_env_order() -> None:
    reordered_dims = dict(reversed(list(SMALL_DIMS.items())))
    reordered_perturb = dict(reversed(list(SMALL_PERTURB.items())))
    a = generate_variants(BASES, SMALL_DIMS, SMALL_PERTURB, 5, 3, scenario=CHECKOUT.scenario)
    b = generate_variants(list(reversed(BASES)), reordered_dims, reordered_perturb, 5, 3, scenario=CHECKOUT.scenario)
    assert a == b


def test_perturbation_draws_follow_their_ranges() -> None:
    specs = small(
        perturb={**SMALL_PERTURB, "card_decline_rate": RangeSpec(kind="choice", choices=[0.0, 0.1, 0.5])}, samples=20
    )
    prices = [v.params["price_factor"] for v in specs]
    assert all(0.85 <= p <= 1.15 and round(p, 2) == p for p in prices)
    assert all(isinstance(v.params["inventory"], int) and 0 <= v.params["inventory"] <= 100 for v in specs)
    assert {v.params["card_decline_rate"] for v in specs} == {0.0, 0.1, 0.5}


def test_json_round_trip_and_record() -> None:
    for spec in small()[:10]:
        assert VariantSpec.from_json(spec.to_json()) == spec
        row = spec.to_record()
        assert json.loads(row["params_json"]) == spec.params
        assert row["network"] == spec.params["network"] and row["content_hash"] == spec.content_hash


def test_content_hash_is_sha256_prefix_of_canonical_json() -> None:
    import hashlib

    params = {"user_tier": "vip", "network": "normal"}
    expected = hashlib.sha256(
        b'{"base_env_id":"order_db_v1","params":{"network":"normal","user_tier":"vip"}}'
    ).hexdigest()[:16]
    assert content_hash("order_db_v1", params) == expected


def test_env_ids_unique_and_readable() -> None:
    specs = small(samples=30)
    assert len({v.env_id for v in specs}) == len(specs) == len({v.content_hash for v in specs})
    params = {
        "network": "latency_500ms",
        "user_tier": "vip",
        "start_stage": "checkout",
        "price_factor": 0.92,
        "inventory": 37,
    }
    assert (
        readable_id("web_checkout_v2", params)
        == "web_checkout_v2_net_latency_500ms_user_vip_stage_checkout_price_0.92_inv_37"
    )
    spec = specs[0]
    assert spec.env_id.startswith(spec.base_env_id + "_net_") and "%" not in spec.env_id


def test_colliding_readable_ids_get_a_hash_suffix() -> None:
    specs = generate_variants(
        BASES[:1],
        {"network": ["normal"]},
        {"price_factor": RangeSpec(kind="choice", choices=[1.0000001, 1.0000002])},
        2,
        0,
        scenario=CHECKOUT.scenario,
    )
    assert len({s.env_id for s in specs}) == 2
    assert all(s.env_id.endswith(s.content_hash[:8]) for s in specs)


def test_demo_config_yields_at_least_7000_valid_variants() -> None:
    cfg = VariantsConfig()
    specs = generate_variants(
        BASES, cfg.dimensions, cfg.perturbations, cfg.samples_per_combination, 0, scenario=CHECKOUT.scenario
    )
    assert len(specs) == 3 * 4 * 3 * 3 * cfg.samples_per_combination >= 7000
    assert len({s.env_id for s in specs}) == len(specs)
    for spec in specs[::97]:
        assert isinstance(spec.scenario(), Scenario)


@pytest.mark.parametrize(
    ("dims", "perturb", "needle"),
    [
        ({"netwrk": ["normal"]}, {}, "variants.dimensions.netwrk"),
        ({"network": ["normal", "carrier_pigeon"]}, {}, "carrier_pigeon"),
        ({"user_tier": ["vip", 3]}, {}, "variants.dimensions.user_tier"),
        (
            {},
            {"price_factor": RangeSpec(kind="uniform", low=0.5, high=12.0)},
            "variants.perturbations.price_factor.high",
        ),
        ({}, {"inventory": RangeSpec(kind="int", low=-5, high=10)}, "variants.perturbations.inventory.low"),
        ({}, {"inventory": RangeSpec(kind="uniform", low=0, high=10)}, "variants.perturbations.inventory.kind"),
        ({}, {"colour": RangeSpec(kind="choice", choices=["red"])}, "variants.perturbations.colour"),
        (
            {"network": ["normal"]},
            {"network": RangeSpec(kind="choice", choices=["normal"])},
            "variants.perturbations.network",
        ),
    ],
)
def test_bad_dimension_or_range_fails_naming_it(dims: dict, perturb: dict, needle: str) -> None:
    with pytest.raises(ConfigError) as info:
        generate_variants(BASES, dims, perturb, 1, 0, scenario=CHECKOUT.scenario)
    assert needle in str(info.value)


def test_more_samples_than_distinct_perturbations_fails() -> None:
    with pytest.raises(ConfigError, match="samples_per_combination"):
        generate_variants(
            BASES,
            {"network": ["normal"]},
            {"inventory": RangeSpec(kind="int", low=0, high=3)},
            5,
            0,
            scenario=CHECKOUT.scenario,
        )


def test_catalogue_write_read_and_card(tmp_path: Path) -> None:
    specs = small()
    path = write_catalogue(specs, tmp_path / "variants", {"seed": 0, "dimensions": SMALL_DIMS})
    assert read_catalogue(path) == specs == read_catalogue(tmp_path / "variants")
    table = pq.read_table(path)
    assert {"env_id", "base_env_id", "family", "content_hash", "params_json", "network", "price_factor"} <= set(
        table.column_names
    )
    card = read_meta(tmp_path / "variants")
    import hashlib

    assert card["catalogue_sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
    assert card["counts"]["total"] == len(specs)
    assert card["counts"]["by_family"] == {"order_db": 20, "payment_api": 20, "web_checkout": 20}
    assert card["counts"]["by_dimension"]["network"] == {"normal": 30, "packet_loss_5pct": 30}
    assert card["seed"] == 0 and "created_at" in card and card["schema"]["inventory"] == "int64"


def test_catalogue_write_is_atomic(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "variants"
    first = small(seed=1)
    write_catalogue(first, out, {"seed": 1})

    def crash(path: Path, meta: object) -> None:
        path.write_text("{half", encoding="utf-8")
        raise OSError("disk full")

    monkeypatch.setattr(variants_mod, "_write_meta", crash)
    with pytest.raises(OSError, match="disk full"):
        write_catalogue(small(seed=2), out, {"seed": 2})
    assert read_catalogue(out) == first and read_meta(out)["seed"] == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["variants"]
    with pytest.raises(OSError):
        write_catalogue(first, tmp_path / "fresh", {})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["variants"]


def test_tampered_catalogue_is_rejected(tmp_path: Path) -> None:
    import pyarrow as pa

    specs = small()
    path = write_catalogue(specs, tmp_path / "v", {})
    table = pq.read_table(path)
    hashes = table.column("content_hash").to_pylist()
    hashes[0] = "0" * 16
    pq.write_table(table.set_column(table.column_names.index("content_hash"), "content_hash", pa.array(hashes)), path)
    with pytest.raises(Exception, match="content_hash"):
        read_catalogue(path)


def test_stable_worker_is_the_same_in_another_process() -> None:
    ids = [s.env_id for s in small()]
    here = [stable_worker(i, 7) for i in ids]
    code = (
        "import json,sys; from agentflow_core.variants import stable_worker; "
        "print(json.dumps([stable_worker(i, 7) for i in json.load(sys.stdin)]))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        input=json.dumps(ids),
        capture_output=True,
        text=True,
        check=True,
        env={"PYTHONHASHSEED": "123"},
    )
    assert json.loads(out.stdout) == here
    assert set(here) == set(range(7))
    with pytest.raises(ValueError):
        stable_worker("x", 0)


def test_run_variants_step_writes_the_demo_catalogue(tmp_path: Path, local_config: Any) -> None:
    from tasks.steps.variants import run_variants

    cfg = local_config()
    summary = run_variants(PhaseContext.of(cfg), tmp_path / "variants", tmp_path / "metrics" / "variants.json")
    assert summary["variants"] == 7236
    assert summary["by_family"] == {"order_db": 2412, "payment_api": 2412, "web_checkout": 2412}
    assert set(summary["by_dimension"]) == {"network", "user_tier", "start_stage"}
    assert json.loads((tmp_path / "metrics" / "variants.json").read_text())["variants"] == 7236
    assert len(read_catalogue(tmp_path / "variants")) == 7236
