"""Tensors a checkpointed block's call holds that no op of the joint graph reads (task fid36).

Non-reentrant checkpointing keeps every tensor argument of the checkpointed call until the block's
backward.  When no op of the traced graph reads an argument, the joint trace drops the op that computes
it, so no data node could stand for it and the sac plan did not count what the step held: Longformer's
``is_index_global_attn`` (read only by ``.any().item()``, a branch the trace specialised on the example:
28 B over a plan at its minimum), Funnel's ``attention_inputs`` (a ``gather`` no op reads: 3.75 KiB
over).  Planned on fixed costs."""
from __future__ import annotations

import pytest
import torch

import memviz
from tests.test_apply import _fixed_cost_profile, _square_loss, check_applied, sac_plan

nn = torch.nn


class Block(nn.Module):
    def __init__(self, branch: bool) -> None:
        super().__init__()
        self.lin = nn.Linear(32, 32)
        self.branch = branch

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        # Longformer: only a data-dependent scalar read of the argument (the branch is not taken on the
        # example); Funnel: no read at all
        if self.branch and not mask.any().item():
            x = x * 2.0
        return x + torch.tanh(self.lin(x))


class Model(nn.Module):
    def __init__(self, branch: bool) -> None:
        super().__init__()
        self.inp, self.out = nn.Linear(32, 32), nn.Linear(32, 4)
        self.blocks = nn.ModuleList(Block(branch) for _ in range(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.blocks[0].branch:
            given = x.abs().sum(-1, keepdim=True) >= 0  # 2 x 64 x 1 bool (all True), for the blocks alone
        else:
            given = torch.gather(x, 2, torch.zeros(2, 64, 16, dtype=torch.long))  # 8 KiB no op reads
        h = self.inp(x)
        for block in self.blocks:
            h = block(h, given)
        return self.out(h)


@pytest.mark.parametrize("branch", [True, False], ids=["scalar_read", "unread"])
def test_call_arguments_the_joint_graph_drops_are_held_as_planned(branch: bool) -> None:
    from memviz.plans.sac import candidate_blocks, eager_graph

    torch.manual_seed(0)
    model, args = Model(branch), (torch.randn(2, 64, 32),)
    prof = _fixed_cost_profile(model, args)
    graph = eager_graph(prof.graph, prof.captured)
    held = 2 * 64 if branch else 2 * 64 * 16 * 4
    blocks = candidate_blocks(prof.model, graph, prof.captured)
    assert len(blocks) == 3
    for block in blocks:
        assert sorted(graph.datas[d].bytes for d in block.held) == [held], block
    plan = sac_plan(prof, 0.5)
    assert plan.timeline.recomputes > 0
    verified = memviz.apply(plan, model, verify=True)  # refused before: the held argument's bytes over
    assert verified.verified_peak_bytes <= plan.budget_bytes
    assert check_applied(model, args, {}, _square_loss, verified.plan) == [verified.plan.peak_bytes] * 3
    # the profile's eager baseline holds it as eager does
    assert prof.measured_peak_bytes == prof.baseline.peak_bytes
