"""The compact CQL loss against TorchRL's ``DiscreteCQLLoss`` (torchrl 0.14.1) on the hand-computed batch.

TorchRL 0.14.1 installs beside torch 2.13.0 without changing it (a dev dependency: the product trains with
:func:`agentflow_core.rl.cql.cql_loss`, which takes the action masks and prioritized replay's weights
directly). TorchRL's loss takes no action mask; a value network that puts illegal actions at ``MASKED_LOGIT`` makes
its logsumexp and its target's max range over the legal actions only, which is what ours does.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from agentflow_core.rl.cql import cql_loss, masked_q

pytestmark = pytest.mark.filterwarnings("ignore:No target network updater")


class TableQ(nn.Module):
    """Q(s, .) read from a table row by a one-hot observation, illegal actions masked."""

    def __init__(self, table: torch.Tensor) -> None:
        super().__init__()
        self.rows = nn.Linear(table.shape[0], table.shape[1], bias=False)
        with torch.no_grad():
            self.rows.weight.copy_(table.T)

    def forward(self, observation: torch.Tensor, action_mask: torch.Tensor) -> torch.Tensor:
        return masked_q(self.rows(observation), action_mask)


def test_cql_loss_equals_torchrl_discrete_cql_on_the_hand_case() -> None:
    from tensordict import TensorDict
    from tensordict.nn import TensorDictModule, TensorDictSequential
    from torchrl.modules import QValueModule
    from torchrl.objectives import DiscreteCQLLoss

    # rows: s1, s2, s1', s2' (the numbers of tests/test_cql.py)
    table = torch.tensor([[1.0, 2.0, 0.0], [0.0, 0.0, 3.0], [0.5, 3.0, 10.0], [7.0, 7.0, 7.0]])
    mask = torch.tensor([[True, True, False], [True, True, True]])
    next_mask = torch.tensor([[True, False, False], [True, True, True]])
    eye = torch.eye(4)
    net = TensorDictSequential(
        TensorDictModule(TableQ(table), in_keys=["observation", "action_mask"], out_keys=["action_value"]),
        QValueModule(action_space="categorical", action_value_key="action_value"),
    )
    loss_module = DiscreteCQLLoss(net, action_space="categorical", delay_value=True)
    loss_module.make_value_estimator(gamma=0.9)
    batch = TensorDict(
        {
            "observation": eye[:2],
            "action_mask": mask,
            "action": torch.tensor([0, 2]),
            "next": {
                "observation": eye[2:],
                "action_mask": next_mask,
                "reward": torch.tensor([[1.0], [2.0]]),
                "done": torch.tensor([[False], [True]]),
                "terminated": torch.tensor([[False], [True]]),
            },
        },
        batch_size=[2],
    )
    theirs = loss_module(batch)
    _, td, penalty, _ = cql_loss(
        masked_q(table[:2], mask),
        table[2:],
        mask,
        next_mask,
        torch.tensor([0, 2]),
        torch.tensor([1.0, 2.0]),
        torch.tensor([False, True]),
        gamma=0.9,
        alpha=1.0,
    )
    assert float(theirs["loss_qvalue"].detach()) == pytest.approx(float(td), rel=1e-6)
    assert float(theirs["loss_cql"].detach()) == pytest.approx(float(penalty), rel=1e-6)
