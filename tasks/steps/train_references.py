"""The reference policies a training run's best checkpoint is judged against on the test split.

* ``exploration`` -- epsilon-greedy around the untrained network;
* ``rules`` -- the process's hand-written rule table per family (the demonstrator of BC and CQL);
* ``oracle`` -- the env's own ``oracle_action()``, reading the hidden state the observation does not
  show: the upper bound of the regret. Played here, on evaluation episodes only; exploration,
  behaviour cloning, the offline stage and PPO never call it. Only where every channel of the
  process has one (:func:`oracle_available`);
* ``bc`` -- the behaviour-cloned actor PPO started from (its snapshot ``bc_actor.safetensors``
  beside the checkpoints), when behaviour cloning ran;
* ``offline`` -- the offline stage's BC+CQL actor, when training started from it.

The BC and offline actors give ``test_regret_closed_bc`` and ``test_regret_closed_offline``: what
each learning stage adds over the one before.
"""

from __future__ import annotations

from pathlib import Path

import torch

from agentflow_core.adapters import load_object
from agentflow_core.atomic import save_tensors
from agentflow_core.contracts import OracleEnv
from agentflow_core.errors import ConfigError
from agentflow_core.pool.batch import oracle_action
from agentflow_core.pool.episodes import EPSILON_GREEDY, EXPERT, ORACLE, ActorSpec
from agentflow_core.rl.cql import actor_state, load_actor
from agentflow_core.rl.policy import ActorCritic
from tasks.context import PhaseContext
from tasks.steps.evaluation import EXPLORATION_EPSILON
from tasks.steps.offline import BC_ACTOR_FILE
from tasks.steps.train_state import TrainingRun

Reference = tuple[str, ActorSpec, ActorCritic | None]


def save_bc_actor(ckpt_root: Path, actor: ActorCritic) -> None:
    """Keep the actor behaviour cloning produced (before PPO changes it) for the final evaluation."""
    ckpt_root.mkdir(parents=True, exist_ok=True)
    save_tensors(actor_state(actor), ckpt_root / BC_ACTOR_FILE)


def copy_offline_bc_actor(ckpt_root: Path, offline_actor: Path) -> None:
    """The offline stage's BC actor (written beside its BC+CQL actor), kept with the checkpoints like BC's own."""
    source = offline_actor.parent / BC_ACTOR_FILE
    if source.is_file():
        ckpt_root.mkdir(parents=True, exist_ok=True)
        (ckpt_root / BC_ACTOR_FILE).write_bytes(source.read_bytes())


def oracle_available(ctx: PhaseContext) -> bool:
    """Whether every channel of the process can play the oracle.

    Its env class implements ``oracle_action`` (:class:`~agentflow_core.contracts.OracleEnv`) and a
    freshly reset env of each base env answers it: a state machine without an ``oracle:`` section
    raises a ConfigError there, and the process then has no oracle.
    """
    entries = [ctx.registry.get(env) for env in ctx.process.base_envs if env in ctx.registry]
    if not entries or not all(_implements_oracle(entry.class_path) for entry in entries):
        return False
    for entry in entries:
        env = entry.make()
        try:
            env.reset(seed=0)
            oracle_action(env)
        except ConfigError:
            return False
        finally:
            env.close()
    return True


def _implements_oracle(class_path: str) -> bool:
    cls = load_object(class_path)
    return isinstance(cls, type) and issubclass(cls, OracleEnv)


def _actor_net(run: TrainingRun, state: dict[str, torch.Tensor]) -> ActorCritic:
    tc, vocab = run.tc, run.vocab
    net = ActorCritic(vocab.obs_dim, vocab.n_actions, tc.hidden_sizes)
    load_actor(net, state)
    return net


def reference_actors(run: TrainingRun) -> list[Reference]:
    """Every reference policy this run can play, by its name in the final evaluation."""
    from safetensors.torch import load_file

    tc = run.tc
    hidden = tuple(tc.hidden_sizes)
    experts = tuple((family, run.ctx.process.expert(family)) for family in sorted({v.family for v in run.test}))
    refs: list[Reference] = [
        ("exploration", ActorSpec(EPSILON_GREEDY, hidden, EXPLORATION_EPSILON), run.untrained),
        ("rules", ActorSpec(EXPERT, experts=experts), None),
    ]
    if oracle_available(run.ctx):
        refs.append(("oracle", ActorSpec(ORACLE), None))
    greedy = ActorSpec("greedy", hidden)
    bc_file = run.ckpt_root / BC_ACTOR_FILE
    if bc_file.is_file():
        refs.append(("bc", greedy, _actor_net(run, load_file(str(bc_file)))))
    if run.offline is not None:
        refs.append(("offline", greedy, _actor_net(run, run.offline.actor)))
    return refs
