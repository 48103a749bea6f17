"""A corpus of hostile params, registry, mapping, OpenAPI and shaping inputs through the real CLI.

Each case must end with exit code 2 and ONE line naming the file and the key (or line), within
5 s and 500 MB of memory beyond the warm interpreter, with nothing written. The cases run in
forked children of one warm interpreter (``cli_harness.py``: imports once, then per case
``RLIMIT_AS`` = current address space + 500 MB and a kill at 5 s); the corpus files live in
``corpus/``, the large ones are generated here.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
import yaml

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
CORPUS = HERE / "corpus"
MEMORY_MB = 500
TIMEOUT_S = 5.0


@dataclass(frozen=True)
class Case:
    """One hostile input: the files it plants, the command, and what the one error line must name."""

    name: str
    files: dict[str, bytes]
    argv: tuple[str, ...]
    names: tuple[str, ...]


def _params(name: str, content: bytes, *names: str) -> Case:
    return Case(f"params/{name}", {"params.yaml": content}, ("validate", "--params", "params.yaml"), names)


def _corpus_params(file: str, *names: str) -> Case:
    return _params(file, (CORPUS / "params" / file).read_bytes(), "params.yaml", *names)


def _env_config(base: str = "payment_api_v1", **changes: object) -> bytes:
    config = yaml.safe_load((REPO / f"configs/envs/{base}.yaml").read_text())
    config.update(changes)
    return yaml.safe_dump(config).encode()


def _registry(name: str, files: dict[str, bytes], *names: str) -> Case:
    return Case(
        f"registry/{name}",
        {f"envs/{k}": v for k, v in files.items()},
        ("envs", "list", "--config-dir", "envs"),
        names,
    )


def _mapping(name: str, mapping: bytes, *names: str, base: str = "payment_api_v1") -> Case:
    config = _env_config(base, mapping="shop.json")
    return _registry(f"mapping/{name}", {"shop.yaml": config, "shop.json": mapping}, "shop.json", *names)


def _openapi(name: str, content: bytes, *names: str) -> Case:
    argv = ("envs", "from-openapi", "spec.yaml", "--family", "shop", "--out-dir", "out")
    return Case(f"openapi/{name}", {"spec.yaml": content}, argv, ("spec.yaml", *names))


def _web_mapping(**rule_when: object) -> bytes:
    mapping = json.loads((REPO / "agentflow_core/mappings/web_checkout_v2.json").read_text())
    mapping["token_rules"][0]["when"] = rule_when
    return json.dumps(mapping).encode()


BOMB = (CORPUS / "params" / "alias_bomb.yaml").read_bytes()
DEEP = b"train: " + b"[" * 5000 + b"]" * 5000 + b"\n"
DEEP_BLOCK = b"".join(b" " * i + b"k:\n" for i in range(200))
DEEP_JSON = b"[" * 100_000 + b"]" * 100_000
BIG_INT = b"base:\n  seed: " + b"9" * 5000 + b"\n"
UTF16 = "train:\n  total_steps: 10\n".encode("utf-16")
BINARY = bytes(range(256)) * 4
RECURSIVE = b"x: &a [*a]\n"  # 12 bytes that once spun the loader's size check forever
RECURSIVE_MAP = b"base: &b\n  seed: 1\n  again: *b\n"
NESTED_COUNTS = "(?:(?:a{999}){999}){999}"  # 24 characters that unroll into ~10^9 nodes when compiled
SHAPING_999 = b'train:\n  reward:\n    shaping:\n      - {condition: "' + b"9" * 990 + b' > 0", reward: 1.0}\n'

CASES = [
    _corpus_params("alias_bomb.yaml", "aliases"),
    _corpus_params("duplicate_section.yaml", "line 5", "'train'", "duplicate key"),
    _corpus_params("markup_value.yaml", "train.clip_range", "[/x]"),
    _corpus_params("nan_token_reward.yaml", "train.reward.token_rewards.PAYMENT_SUCCESS", "finite"),
    _corpus_params("inf_shaping_reward.yaml", "train.reward.shaping.0.reward", "finite"),
    _corpus_params("nan_shaping_weight.yaml", "train.reward.shaping.0.weight", "finite"),
    _corpus_params("shaping_overflow.yaml", "train.reward.shaping.0.condition", "overflows"),
    _corpus_params("nan_failure_threshold.yaml", "stress.failure_reward_threshold", "finite"),
    _corpus_params("nan_promote_gain.yaml", "report.promote_min_reward_gain", "finite"),
    _corpus_params("huge_num_envs.yaml", "train.num_envs", "less than or equal to 4096"),
    _corpus_params("huge_hidden_sizes.yaml", "train.hidden_sizes.0", "less than or equal to 4096"),
    _corpus_params("inf_step_timeout.yaml", "pool.step_timeout_s", "finite"),
    _corpus_params("negative_seed.yaml", "base.seed", "greater than or equal to 0"),
    _corpus_params("seed_2_70.yaml", "base.seed", "less than 4294967296"),
    _corpus_params("not_a_mapping.yaml", "<root>"),
    _corpus_params("python_tag.yaml", "line 2", "python/object"),
    _params(
        "huge_catalogue.yaml",
        b"variants: {samples_per_combination: 100000}\n",
        "params.yaml",
        "variants",
        "10800000 variants",
    ),
    _params("deep_nesting.yaml", DEEP, "params.yaml", "line 1", "nested deeper"),
    _params("deep_block.yaml", DEEP_BLOCK, "params.yaml", "nested deeper"),
    _params("big_int.yaml", BIG_INT, "params.yaml", "line 2", "5000 digits"),
    _params("utf16.yaml", UTF16, "params.yaml", "UTF-16"),
    _params("binary.yaml", BINARY, "params.yaml", "<file>"),
    _params("shaping_999_digits.yaml", SHAPING_999, "params.yaml", "train.reward.shaping.0.condition", "digits"),
    _registry("alias_bomb", {"bomb.yaml": BOMB}, "bomb.yaml", "aliases"),
    _registry("utf16", {"shop.yaml": UTF16}, "shop.yaml", "UTF-16"),
    _registry("binary", {"shop.yaml": BINARY}, "shop.yaml", "unreadable"),
    _registry("deep", {"shop.yaml": DEEP}, "shop.yaml", "nested deeper"),
    _registry("big_int", {"shop.yaml": BIG_INT}, "shop.yaml", "5000 digits"),
    _registry("duplicate_key", {"shop.yaml": _env_config() + b"env_id: other\n"}, "shop.yaml", "'env_id'"),
    _registry("class_path_outside", {"shop.yaml": _env_config(class_path="plant:Env")}, "shop.yaml", "class_path"),
    _registry("adapter_outside", {"shop.yaml": _env_config(adapter="plant:Adapter")}, "shop.yaml", "adapter"),
    _registry("mapping_absolute", {"shop.yaml": _env_config(mapping="/etc/passwd")}, "shop.yaml", "mapping"),
    _registry("mapping_escape", {"shop.yaml": _env_config(mapping="../params.yaml")}, "shop.yaml", "mapping"),
    _registry("markup_env_id", {"shop.yaml": _env_config(env_id="[/x]")}, "shop.yaml", "env_id", "[/x]"),
    _mapping("deep_json", DEEP_JSON, "RecursionError"),
    _mapping("not_an_object", b"[1, 2]", "expected a mapping"),
    _mapping("bad_regex", _web_mapping(text_regex="(unclosed"), "text_regex", "invalid regex", base="web_checkout_v2"),
    _mapping("long_regex", _web_mapping(text_regex="a" * 5000), "text_regex", "longer than", base="web_checkout_v2"),
    _openapi("class_path.yaml", (CORPUS / "openapi" / "class_path.yaml").read_bytes(), "x-agentflow-class-path"),
    _openapi("alias_bomb.yaml", (CORPUS / "openapi" / "alias_bomb.yaml").read_bytes(), "aliases"),
    _openapi("list_root.yaml", (CORPUS / "openapi" / "list_root.yaml").read_bytes(), "<root>"),
    _openapi("duplicate_paths.yaml", (CORPUS / "openapi" / "duplicate_paths.yaml").read_bytes(), "'paths'"),
    _openapi("paths_list.yaml", (CORPUS / "openapi" / "paths_list.yaml").read_bytes(), "$.paths", "expected a mapping"),
    _openapi("utf16.yaml", UTF16, "UTF-16"),
    _params("recursive_alias.yaml", RECURSIVE, "params.yaml", "line 1", "recursive alias"),
    _params("recursive_mapping.yaml", RECURSIVE_MAP, "params.yaml", "line 1", "recursive alias"),
    _registry("recursive_alias", {"shop.yaml": RECURSIVE}, "shop.yaml", "recursive alias"),
    _openapi("recursive_alias.yaml", RECURSIVE, "recursive alias"),
    _mapping(
        "nested_counted_regex",
        _web_mapping(text_regex=NESTED_COUNTS),
        "text_regex",
        "unrolls",
        base="web_checkout_v2",
    ),
    _mapping(
        "nested_groups_regex", _web_mapping(text_regex="(" * 40 + "a" + ")" * 40), "nested", base="web_checkout_v2"
    ),
    Case(
        "set/recursive_alias",
        {"params.yaml": f"base: {{env_config_dir: {REPO / 'configs/envs'}}}\n".encode()},
        ("run", "--params", "params.yaml", "--set", "train.total_steps=&a [*a]"),
        ("--set", "train.total_steps", "recursive alias"),
    ),
    Case(
        "process/recursive_alias",
        {
            "params.yaml": b"process: evil\nbase: {env_config_dir: envs}\n",
            "envs/.keep": b"",
            "processes/evil.yaml": RECURSIVE,
        },
        ("validate", "--params", "params.yaml"),
        ("evil.yaml", "recursive alias"),
    ),
    _openapi("deep.yaml", DEEP, "nested deeper"),
    *(
        []
        if torch.cuda.is_available()
        else [_params("cuda_without_gpu.yaml", b"base: {device: cuda}\n", "params.yaml", "base.device", "no CUDA GPU")]
    ),
    Case(
        "variants/names_the_file_passed",
        {
            "custom.yaml": (
                f"base: {{env_config_dir: {REPO / 'configs/envs'}}}\n"
                "variants:\n  dimensions: {no_such_field: [1, 2]}\n"
            ).encode()
        },
        ("variants", "--params", "custom.yaml", "--out", "out"),
        ("custom.yaml", "variants.dimensions.no_such_field"),
    ),
]


def _snapshot(root: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns) for p in sorted(root.rglob("*"))}


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[dict, dict, dict]]:
    """Run the whole corpus through one warm harness; returns name -> (result, before, after)."""
    base = tmp_path_factory.mktemp("corpus")
    plant = base / "plant"  # a module whose import would leave a mark: class paths must never import it
    plant.mkdir()
    (plant / "plant.py").write_text(
        "from pathlib import Path\nPath(__file__).with_name('IMPORTED').touch()\nclass Env: ...\nclass Adapter: ...\n"
    )
    cases, snapshots = [], {}
    for i, case in enumerate(CASES):
        cwd, out = base / f"case{i}" / "cwd", base / f"case{i}" / "out"
        out.mkdir(parents=True)
        for rel, content in case.files.items():
            (cwd / rel).parent.mkdir(parents=True, exist_ok=True)
            (cwd / rel).write_bytes(content)
        snapshots[case.name] = (cwd, _snapshot(cwd))
        cases.append({"cwd": str(cwd), "argv": list(case.argv), "out": str(out)})
    (base / "cases.json").write_text(json.dumps(cases))
    env = {"PYTHONPATH": f"{REPO}:{plant}", "COLUMNS": "400", "PATH": "/usr/bin:/bin", "HOME": str(base)}
    subprocess.run(
        [sys.executable, str(HERE / "cli_harness.py"), str(base / "cases.json"), str(base / "results.json")]
        + ["--memory-mb", str(MEMORY_MB), "--timeout-s", str(TIMEOUT_S)],
        check=True,
        env=env,
        cwd=base,
        timeout=300,
    )
    assert not (plant / "IMPORTED").exists(), "a class path from a config imported a module"
    outcome = json.loads((base / "results.json").read_text())
    shutil.rmtree(plant)
    return {
        case.name: (result, snapshots[case.name][1], _snapshot(snapshots[case.name][0]))
        for case, result in zip(CASES, outcome, strict=True)
    }


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_hostile_input_exits_2_with_one_line_and_writes_nothing(
    case: Case, results: dict[str, tuple[dict, dict, dict]]
) -> None:
    result, before, after = results[case.name]
    lines = [line for line in (result["stdout"] + result["stderr"]).splitlines() if line.strip()]
    assert result["exit_code"] == 2, result
    assert len(lines) == 1, lines
    for name in case.names:
        assert name in lines[0], (name, lines[0])
    assert result["seconds"] < TIMEOUT_S
    assert after == before, "the command wrote or changed files"


def test_user_text_in_a_valid_config_is_printed_literally(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from flows.cli.app import app

    params = tmp_path / "params.yaml"
    params.write_text('base:\n  run_name: "[/x] [bold]demo"\n')
    result = CliRunner().invoke(app, ["validate", "--params", str(params)], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "run=[/x] [bold]demo seed=0" in result.output
