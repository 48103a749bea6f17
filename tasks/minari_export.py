"""The trajectory dataset exported as a Minari 0.5 dataset (HDF5), so other offline-RL tools can read it.

Written through Minari's own ``create_dataset_from_buffers`` (its on-disk layout, metadata and
version checks), into ``<out>/<namespace>/<name>-v<N>/`` (``metadata.json`` + ``data/main_data.hdf5``).
Minari finds datasets under ``MINARI_DATASETS_PATH``; it is pointed at ``out`` only while writing.

One Minari episode per dataset episode, in episode-id order: ``observations`` has ``T + 1`` rows
(Minari stores the state after the last action too). The dataset rows record ``s_t`` and the tokens
after each step but not the feature vector after the last action, so the final observation is the
multi-hot of the recorded final tokens (exact) with the features of the last recorded state
(``infos["final_features_carried"]`` is 1 on that row). ``infos["action_mask"]`` is the legal-action mask
of each state (all False on the final row: no action is taken there). An episode cut off by the end of
the exploration run (neither terminated nor truncated in the dataset) is marked truncated on its last
step. Rewards are the dataset's training reward (``reward`` column).
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from agentflow_core.rl.trajectories import Episode, iter_episodes, read_card
from agentflow_core.semantics import Vocabulary

DATASET_ID = "agentflow/trajectories-v0"


@contextmanager
def _datasets_root(root: Path) -> Iterator[None]:
    previous = os.environ.get("MINARI_DATASETS_PATH")
    os.environ["MINARI_DATASETS_PATH"] = str(root)
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop("MINARI_DATASETS_PATH", None)
        else:
            os.environ["MINARI_DATASETS_PATH"] = previous


def final_observation(episode: Episode, vocabulary: Vocabulary) -> np.ndarray:
    """The state after the last action: recorded final tokens, features carried from the last recorded state."""
    tokens = [t for t in episode.tokens[-1] if t in set(vocabulary.tokens)]
    return vocabulary.encode(tokens, vocabulary.decode_features(episode.obs[-1]))


def episode_buffer(episode: Episode, index: int, vocabulary: Vocabulary) -> Any:
    """One Minari ``EpisodeBuffer`` (T actions, T + 1 observations and infos)."""
    from minari.data_collector import EpisodeBuffer

    steps = len(episode)
    terminations = np.zeros(steps, dtype=bool)
    truncations = np.zeros(steps, dtype=bool)
    terminations[-1] = episode.terminated
    truncations[-1] = not episode.terminated  # truncated, or cut off by the end of the run
    masks = np.concatenate([episode.action_mask, np.zeros((1, vocabulary.n_actions), dtype=bool)])
    carried = np.zeros(steps + 1, dtype=np.int64)
    carried[-1] = 1
    return EpisodeBuffer(
        id=index,
        observations=np.concatenate([episode.obs, final_observation(episode, vocabulary)[None]]).astype(np.float32),
        actions=episode.actions.astype(np.int64),
        rewards=episode.rewards.astype(np.float64).tolist(),
        terminations=terminations.tolist(),
        truncations=truncations.tolist(),
        infos={"action_mask": masks, "final_features_carried": carried},
    )


def export_minari(
    trajectories: Path, out: Path, vocabulary: Vocabulary, dataset_id: str = DATASET_ID
) -> dict[str, Any]:
    """Write the dataset at ``trajectories`` (in ``vocabulary``) as Minari dataset ``dataset_id`` under ``out``."""
    import gymnasium as gym
    import minari

    trajectories, out = Path(trajectories), Path(out)
    card = read_card(trajectories)
    episodes = iter_episodes(trajectories, vocabulary=vocabulary)
    buffers = [episode_buffer(ep, i, vocabulary) for i, ep in enumerate(episodes)]
    if not buffers:
        raise ValueError(f"{trajectories} holds no episodes to export")
    out.mkdir(parents=True, exist_ok=True)
    with _datasets_root(out.resolve()), warnings.catch_warnings():
        # no Gymnasium env collected these episodes (three channels behind one semantic vocabulary)
        warnings.filterwarnings("ignore", message=r"`eval_env` is set to None")
        warnings.filterwarnings("ignore", message=r"env_spec is None")
        warnings.filterwarnings("ignore", message=r"`author_email` is set to None")
        warnings.filterwarnings("ignore", message=r"`code_permalink` is set to None")
        if dataset_id in minari.list_local_datasets():
            minari.delete_dataset(dataset_id)
        dataset = minari.create_dataset_from_buffers(
            dataset_id=dataset_id,
            buffer=buffers,
            observation_space=gym.spaces.Box(-np.inf, np.inf, shape=(vocabulary.obs_dim,), dtype=np.float32),
            action_space=gym.spaces.Discrete(vocabulary.n_actions),
            algorithm_name="AgentFlow explore phase (epsilon-greedy, coverage-driven)",
            author="AgentFlow",
            description=(
                f"AgentFlow trajectory dataset (schema {card.get('schema_version')}, vocabulary "
                f"{card.get('vocab_version')}): {card.get('rows')} steps over {card.get('episodes')} episodes, "
                f"{len(card.get('cycles') or [None])} cycle(s). Observations: multi-hot semantic tokens + features; "
                "infos: action_mask; the final observation carries the last recorded features."
            ),
            data_format="hdf5",
        )
        summary = {
            "dataset_id": dataset_id,
            "path": str(out / dataset_id),
            "episodes": int(dataset.total_episodes),
            "steps": int(dataset.total_steps),
            "minari_version": minari.__version__,
        }
    return summary
