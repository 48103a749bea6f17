"""Damaged catalogue, trajectory shards and cards give one clear error naming the file."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest
from pool_fixtures import tiny_variants

from agentflow_core.errors import DataFileError
from agentflow_core.rl.trajectories import META_FILE, read_card, read_steps
from agentflow_core.semantics import CHECKOUT
from agentflow_core.variants import CATALOGUE_FILE, read_catalogue, read_meta, write_catalogue

DAMAGE = {
    "truncated": lambda data: data[: len(data) // 2],
    "random_bytes": lambda data: np.random.default_rng(0).bytes(len(data)),
    "empty": lambda data: b"",
    "utf16_text": lambda data: "not parquet".encode("utf-16"),
}


@pytest.mark.parametrize("how", sorted(DAMAGE))
def test_a_damaged_catalogue_names_the_file(tmp_path: Path, how: str) -> None:
    out = tmp_path / "variants"
    write_catalogue(tiny_variants(5), out, {"generator": "test"})
    assert len(read_catalogue(out)) == 5
    file = out / CATALOGUE_FILE
    file.write_bytes(DAMAGE[how](file.read_bytes()))
    with pytest.raises(DataFileError, match=f"{file}: damaged or unreadable"):
        read_catalogue(out)


@pytest.mark.parametrize("content", [b"", b"\xff\xfe{", b"[1, 2]", b"[" * 100_000])
def test_a_damaged_catalogue_card_names_the_file(tmp_path: Path, content: bytes) -> None:
    out = tmp_path / "variants"
    write_catalogue(tiny_variants(3), out, {"generator": "test"})
    (out / "_meta.json").write_bytes(content)
    with pytest.raises(DataFileError, match=f"{out / '_meta.json'}: damaged or unreadable"):
        read_meta(out)


def _dataset(tmp_path: Path, shard: bytes, name: str = "shard_00000.parquet") -> Path:
    path = tmp_path / "trajectories"
    path.mkdir()
    (path / name).write_bytes(shard)
    card = {"shards": [{"file": name, "sha256": hashlib.sha256(shard).hexdigest()}]}
    (path / META_FILE).write_text(json.dumps(card))
    return path


@pytest.mark.parametrize("how", sorted(DAMAGE))
def test_a_damaged_trajectory_shard_names_the_file(tmp_path: Path, how: str) -> None:
    path = _dataset(tmp_path, DAMAGE[how](b"PAR1" + bytes(200) + b"PAR1"))
    with pytest.raises(DataFileError, match=f"{path / 'shard_00000.parquet'}: damaged or unreadable"):
        read_steps(path, vocabulary=CHECKOUT)


@pytest.mark.parametrize("name", ["../../outside.parquet", "/etc/passwd", "missing.parquet"])
def test_a_card_cannot_point_outside_its_dataset(tmp_path: Path, name: str) -> None:
    (tmp_path / "outside.parquet").write_bytes(b"x")
    path = tmp_path / "sub" / "trajectories"
    path.mkdir(parents=True)
    (path / META_FILE).write_text(json.dumps({"shards": [{"file": name, "sha256": "0"}]}))
    with pytest.raises(DataFileError, match="is not a file inside"):
        read_steps(path, vocabulary=CHECKOUT)


@pytest.mark.parametrize("content", [b"", b"{}", b'{"shards": 3}', bytes(range(256))])
def test_a_damaged_trajectory_card_names_the_file(tmp_path: Path, content: bytes) -> None:
    (tmp_path / META_FILE).write_bytes(content)
    with pytest.raises(DataFileError, match=f"{tmp_path / META_FILE}: damaged or unreadable"):
        read_card(tmp_path)


def _shard_bytes(reward: float, obs_value: float = 0.0) -> bytes:
    """A well-formed two-row shard whose second row holds ``reward`` and ``obs_value``."""
    import io

    import pyarrow as pa
    import pyarrow.parquet as pq

    from agentflow_core.rl.trajectories import schema

    SCHEMA = schema(CHECKOUT)

    width = SCHEMA.field("obs").type.list_size
    row = {f.name: None for f in SCHEMA}
    row.update(episode_id="e", env_id="env", step_id=0, action=0, reward=0.0, env_reward=0.0)
    row.update(base_reward=0.0, shaping_reward=0.0, obs=[0.0] * width)
    row.update(action_mask=[True] * SCHEMA.field("action_mask").type.list_size, tokens=[])
    rows = [row, {**row, "step_id": 1, "reward": reward, "obs": [0.0] * (width - 1) + [obs_value]}]
    sink = io.BytesIO()
    pq.write_table(pa.Table.from_pylist(rows, schema=SCHEMA), sink)
    return sink.getvalue()


@pytest.mark.parametrize(("reward", "obs", "column"), [(float("nan"), 0.0, "reward"), (1.0, float("inf"), "obs")])
def test_a_shard_with_a_matching_checksum_but_non_finite_numbers_is_damaged(
    tmp_path: Path, reward: float, obs: float, column: str
) -> None:
    """The card is data: a NaN reward rewritten with its checksum would poison BC and CQL, so it is refused."""
    (tmp_path / "clean").mkdir()
    assert len(read_steps(_dataset(tmp_path / "clean", _shard_bytes(1.0)), vocabulary=CHECKOUT)) == 2
    path = _dataset(tmp_path, _shard_bytes(reward, obs))
    with pytest.raises(DataFileError, match=rf"shard_00000\.parquet: .*non-finite value in column '{column}' at row 1"):
        read_steps(path, vocabulary=CHECKOUT)
