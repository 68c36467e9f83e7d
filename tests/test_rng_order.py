"""Random operators draw from one generator stream: the order of their first executions decides every
mask.  Capture chains them in eager order with 0-byte tokens (`solvers.with_order_chain`), so no solver
can reorder them; recomputations replay the saved state and need no earlier random op again."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn
from torch.nn import functional as F

import memviz
from memviz.profiling.capture import capture, is_random
from memviz.profiling.profile import ProfileWarning, profile
from solvers import GraphBuilder, Phase, compute, eager_schedule, free, simulate, with_order_chain
from solvers.ir import GraphError
from solvers.olla import reorder
from tests.patience import patient_plan
from tests.test_zoo import (
    STRATEGIES,
    ZooCase,
    _assert_same,
    _assert_updated_alike,
    _fresh,
    check_train,
    plan_or_minimum,
)


# --- the IR transformation, torch-free ----------------------------------------------------------------
def _two_branches():
    """x -> r1 (random, small output held to the join) and x -> r2 (random) -> big transient -> small;
    capture order r1 first, but running the r2 branch first lowers the peak (r1's output is not yet
    alive during the big transient), so a peak-minimising reorder swaps the random ops."""
    b = GraphBuilder("two_branches")
    x = b.data("x", 10, "input")
    a = b.data("a", 40)
    r2 = b.data("r2", 10)
    big = b.data("big", 1000)
    s = b.data("s", 10)
    out = b.data("out", 10, "output")
    c1 = b.compute("r1", [x], [a])
    c2 = b.compute("r2", [x], [r2])
    b.compute("expand", [r2], [big])
    b.compute("reduce", [big], [s])
    b.compute("join", [a, s], [out])
    b.outputs.append(out)
    return b.build(), (c1, c2)


def _first_order(schedule, ids) -> list[int]:
    return list(dict.fromkeys(s.node for s in schedule if s.op == "compute" and s.node in ids))


def test_reorder_swaps_unchained_random_ops_and_keeps_chained_ones() -> None:
    graph, random = _two_branches()
    unchained = reorder(graph, time_limit=5.0)
    assert _first_order(unchained.schedule, random) == [1, 0]  # what OLLA did to BART's dropouts
    chained = with_order_chain(graph, random)
    result = reorder(chained, time_limit=5.0)
    assert _first_order(result.schedule, random) == [0, 1]
    assert simulate(chained, result.schedule).valid


def test_chain_makes_an_out_of_order_schedule_invalid() -> None:
    graph, random = _two_branches()
    chained = with_order_chain(graph, random)
    swapped = eager_schedule(graph, [1, 2, 3, 0, 4])  # what OLLA returned before the fix
    assert simulate(graph, swapped).valid
    issues = simulate(chained, swapped).issues  # on the chained graph r2 first reads the token
    assert issues and "rng order: r1 -> r2" in str(issues[0]) and "never computed" in str(issues[0]), issues


def test_token_is_kept_so_a_recompute_needs_no_earlier_random_op() -> None:
    graph, random = _two_branches()
    chained = with_order_chain(graph, random)
    token = len(graph.datas)
    assert chained.datas[token].bytes == 0 and token in chained.outputs
    assert chained.computes[0].outputs[-1] == token and chained.computes[1].inputs[-1] == token
    # r2's output freed and recomputed alone (r1 never runs twice): valid, the token stayed alive
    steps = [compute(0), compute(1), compute(2), free(2), free(3), compute(1), compute(2), free(2),
             compute(3), free(3), compute(4), free(1), free(4)]
    timeline = simulate(chained, steps)
    assert timeline.valid, timeline.issues
    assert timeline.recomputes == 2


def test_chain_rejects_unordered_ids() -> None:
    graph, _ = _two_branches()
    with pytest.raises(GraphError):
        with_order_chain(graph, [1, 0])
    assert with_order_chain(graph, [1]) is graph
    b = GraphBuilder()
    b.compute("c", [], [b.data("d", 1)], phase=Phase.FORWARD)
    with pytest.raises(GraphError):
        with_order_chain(b.build(), [0, 7])


# --- captured models ---------------------------------------------------------------------------------
class TwoBranch(nn.Module):
    """Two independent dropout branches; eager runs branch a first, but running branch b (a big
    transient, summed away) first lowers the peak: OLLA reordered the dropouts before the fix."""

    def __init__(self, d: int = 16, wide: int = 64, k: int = 64) -> None:
        super().__init__()
        self.a1, self.a2, self.b = nn.Linear(d, wide), nn.Linear(wide, d), nn.Linear(d, d)
        self.register_buffer("offsets", torch.linspace(-1, 1, k))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = self.a2(F.dropout(self.a1(x), 0.5, self.training))
        b = F.dropout(self.b(x), 0.5, self.training)
        return a + (b.unsqueeze(-1) + self.offsets).sum(-1)


def _two_branch_case() -> ZooCase:
    torch.manual_seed(0)
    return ZooCase(TwoBranch().double(), (torch.randn(8, 16, dtype=torch.float64),))


@pytest.fixture(scope="module")
def two_branch() -> tuple[ZooCase, memviz.Profile]:
    case = _two_branch_case()
    return case, profile(case.model, case.args, repeats=1, warmup=0)


def test_capture_chains_the_random_ops(two_branch) -> None:
    _, prof = two_branch
    cap, graph = prof.captured, prof.graph
    random = [c for c, fx in enumerate(cap.compute_fx) if fx is not None and is_random(cap.nodes[fx])]
    assert len(random) == 2
    token = graph.computes[random[0]].outputs[-1]
    assert graph.datas[token].bytes == 0 and token in graph.computes[random[1]].inputs
    assert cap.data_fx[token] is None  # holds no tensor: export's free of it is a no-op


@pytest.mark.parametrize("strategy", ("none", *STRATEGIES))
def test_every_strategy_trains_like_eager(two_branch, strategy: str) -> None:
    case, prof = two_branch
    cap = prof.captured
    random = {c for c, fx in enumerate(cap.compute_fx) if fx is not None and is_random(cap.nodes[fx])}
    plan = plan_or_minimum(prof, 0.9, strategy) if strategy != "none" else memviz.plan(prof, strategy="none")
    assert _first_order(plan.schedule, random) == sorted(random)
    check_train(case, plan)  # float64: outputs, gradients, buffers bitwise equal over 3 steps


@pytest.mark.parametrize("strategy", ("checkmate", "rockmate"))
def test_bart_trains_like_eager(strategy: str) -> None:
    """BART (dropout on): rockmate, rotor and sqrt ran the decoder's embedding dropout before the
    encoder's (the chain put the decoder's embedding, which reads only inputs, in its first blocks), and
    checkmate's MILP may start from their schedules: equal to eager over 3 AdamW steps at 50% of the
    strategy's range (`tests/test_real_models.py`'s contract)."""
    from tests.test_real_models import budget_at, check_contract, profiled

    _, _, prof = profiled("bart")
    cap = prof.captured
    random = {c for c, fx in enumerate(cap.compute_fx) if fx is not None and is_random(cap.nodes[fx])}
    plan = patient_plan(prof, budget_at("bart", strategy, 0.5), strategy=strategy, time_limit=5.0,
                        frontier=False, packing=False)
    assert _first_order(plan.schedule, random) == sorted(random)
    check_contract("bart", strategy, 0.5)


# --- a model that changes itself on its first call ------------------------------------------------------
class _Head(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.proj = nn.Linear(d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.dropout(self.proj(x), 0.5, self.training)


class FirstCallRebuild(nn.Module):
    """Hugging Face BigBird at a sequence below its block-sparse minimum, small: its first call swaps in a
    new head (an ``nn.Linear`` initialised from the global generator: two ``uniform_``) that takes over
    the old projection, once.  Traced first, the graph kept those two draws, which eager never makes
    again: the exported module drew its dropout mask two draws further along the stream."""

    def __init__(self, d: int = 8) -> None:
        super().__init__()
        self.head = _Head(d)
        self.rebuilt = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.rebuilt:
            head = _Head(x.shape[-1])
            head.proj = self.head.proj
            self.head, self.rebuilt = head, True
        return self.head(x)


class EveryCallInit(nn.Module):
    """Creates an ``nn.Linear`` at every call (two ``uniform_`` from the global generator), unused, before
    its dropout: functionalization makes the draws pure ops with no user, which the graph keeps anyway
    (dead-code elimination leaves seeded random ops alone), so the exported step draws them as eager does."""

    def __init__(self, d: int = 8) -> None:
        super().__init__()
        self.proj = nn.Linear(d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        nn.Linear(x.shape[-1], 4)
        return F.dropout(self.proj(x), 0.5, self.training)


def _adamw_step(module: nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor, seed: int) -> torch.Tensor:
    torch.manual_seed(seed)
    out = module(x)
    out.sum().backward()
    opt.step()
    return out.detach()


@pytest.mark.parametrize(("cls", "random_ops"), [
    (FirstCallRebuild, ["memviz.cpu_dropout.default"]),
    (EveryCallInit, ["aten.uniform.default", "aten.uniform.default", "memviz.cpu_dropout.default"]),
])
def test_initialisation_draws_in_forward_train_like_eager(cls: type[nn.Module], random_ops: list[str]
                                                          ) -> None:
    """The graph draws what eager draws from then on (a first call's initialisation draws are not made
    again; every call's are), and the exported module's outputs, gradients and parameters equal eager's
    over 3 AdamW steps (float64: bitwise)."""
    torch.manual_seed(0)
    model, x = cls().double(), torch.randn(4, 8, dtype=torch.float64)
    prof = profile(model, (x,), optimizer=torch.optim.AdamW, repeats=1, warmup=0,
                   fallback=False).with_costs("fake:v100")
    cap = prof.captured
    assert cap.torch_draws is None
    random = [cap.nodes[fx] for fx in cap.compute_fx if fx is not None and is_random(cap.nodes[fx])]
    assert [str(n.target) for n in random] == random_ops
    original, exported = copy.deepcopy(model), memviz.export(memviz.plan(prof, strategy="none"))
    opt_a, opt_b = torch.optim.AdamW(original.parameters()), torch.optim.AdamW(exported.parameters())
    for i in range(3):
        x_a, x_b = _fresh(x), _fresh(x)
        out_a, out_b = _adamw_step(original, opt_a, x_a, i), _adamw_step(exported, opt_b, x_b, i)
        _assert_same(out_a, out_b, f"output, step {i}")
        _assert_updated_alike(original, exported, f"step {i}")
        opt_a.zero_grad()
        opt_b.zero_grad()


class DrawsOutsideTheTrace(nn.Module):
    """Draws from torch's generator only where it is not being traced (libraries skip work under
    ``torch.compiler.is_compiling()``): no trace can see that draw."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not torch.compiler.is_compiling():
            torch.rand(1)
        return F.dropout(self.proj(x), 0.5, self.training)


def test_draws_the_capture_cannot_see_are_warned_about() -> None:
    x = torch.randn(2, 8)
    _, cap = capture(DrawsOutsideTheTrace(), (x,))
    assert cap.torch_draws == (2, 1)
    with pytest.warns(ProfileWarning, match=r"2 times in eager mode but 1 times in its captured graph"):
        profile(DrawsOutsideTheTrace(), (x,), measure=False)
    _, plain = capture(TwoBranch(), (torch.randn(8, 16),))
    assert plain.torch_draws is None


def test_apply_draws_as_eager_where_the_export_cannot() -> None:
    """memviz.apply runs the model's own forward (checkpointed regions replay their RNG state): the draw
    no trace sees is made as in eager mode, and 3 AdamW steps equal eager's."""
    from tests.test_apply import check_applied, sac_plan

    torch.manual_seed(0)
    model, x = DrawsOutsideTheTrace(), torch.randn(2, 8)
    with pytest.warns(ProfileWarning, match="memviz.apply runs the model's own forward"):
        prof = profile(model, (x,), repeats=1, warmup=0, fallback=False)
    check_applied(model, (x,), {}, lambda out: out.sum(), sac_plan(prof.with_costs("fake:v100"), 0.5))
