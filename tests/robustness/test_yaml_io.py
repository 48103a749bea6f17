"""The limited YAML loader: ordinary files load as PyYAML's safe loader would; bombs and duplicates do not."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import yaml

from tasks.yaml_io import MAX_ALIASES, YamlLimitError, load_yaml_file, load_yaml_text

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    "path",
    [REPO / "params.yaml", *sorted((REPO / "configs/envs").glob("*.yaml")), REPO / "tests/data/shop_openapi.yaml"],
)
def test_shipped_files_load_exactly_as_safe_load(path: Path) -> None:
    assert load_yaml_file(path) == yaml.safe_load(path.read_text())


def test_anchors_and_merge_keys_within_limits_still_work() -> None:
    text = "base: &b {seed: 1, run_name: x}\nother:\n  <<: *b\n  seed: 2\nlist: [*b, *b]\n"
    assert load_yaml_text(text) == yaml.safe_load(text)


@pytest.mark.parametrize(
    ("text", "where", "reason"),
    [
        ("a: 1\nb: 2\na: 3\n", "line 3, column 1, key 'a'", "duplicate key"),
        ("a:\n  b: {c: 1, c: 2}\n", "line 2, column 13, key 'c'", "duplicate key"),
        ("a: &x 1\nb: [" + ", ".join(["*x"] * (MAX_ALIASES + 1)) + "]\n", "line 2", "more than 64 aliases"),
        ("a: " + "[" * 65 + "]" * 65, "line 1", "nested deeper than 64"),
        ("a: " + "1" * 65, "line 1, column 4", "integer with 65 digits"),
        ("a: !!python/name:os.system\n", "line 1", "could not determine a constructor"),
        ("a: [1, 2\n", "line 2", "malformed YAML"),
        ("a: b\x00", "<file>", "NUL"),
        ("x" * ((1 << 20) + 1), "<file>", "larger than"),
    ],
)
def test_limits_and_errors_name_the_place(text: str, where: str, reason: str) -> None:
    with pytest.raises(YamlLimitError) as err:
        load_yaml_text(text)
    assert err.value.where.startswith(where) and reason in err.value.reason


def test_file_level_checks(tmp_path: Path) -> None:
    for content, reason in ((b"\xff\xfea\x00", "UTF-16"), (b"a: \xff\n", "not UTF-8"), (b"x" * (2 << 20), "larger")):
        (tmp_path / "f.yaml").write_bytes(content)
        with pytest.raises(YamlLimitError, match=reason):
            load_yaml_file(tmp_path / "f.yaml")


@pytest.mark.parametrize(
    "text",
    [
        "x: &a [*a]",
        "&a [*a]",
        "x: &a {k: *a}",
        "x: &a [[[[*a]]]]",
        "x: &a {<<: *a}",
        "a: &b\n  seed: 1\n  c: [1, {d: *b}]\n",
        "- &a [x, &b [*a, *b]]",
    ],
)
def test_recursive_aliases_are_refused_in_milliseconds(text: str) -> None:
    started = time.perf_counter()
    with pytest.raises(YamlLimitError, match="recursive alias"):
        load_yaml_text(text)
    assert time.perf_counter() - started < 0.05


def test_a_shared_anchor_that_is_not_a_cycle_still_loads() -> None:
    text = "a: &b [1, 2]\nc: [*b, {d: *b}]\ne: &f {g: *b}\nh: [*f, *f]\n"
    assert load_yaml_text(text) == yaml.safe_load(text)
