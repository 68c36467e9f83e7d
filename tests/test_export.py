"""Export: the planned module gives the original's outputs and gradients, with the planned memory."""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import functools
import re
from typing import Any

import pytest
import torch

from examples.models import EXAMPLES, gpt, mlp, resnet
from memviz.plans.planning import plan as memviz_plan
from memviz.profiling.capture import default_loss
from memviz.profiling.profile import Profile, profile
from memviz.profiling.tracker import measure_peak, tensors_of
from memviz.runtime.export import StalePlanError, export, load_source
from solvers import DataKind, Graph, eager_schedule, simulate
from solvers.schedule import Schedule, Step
from tests.test_zoo import Untracked


@dataclasses.dataclass
class HandPlan:
    """The attributes of a memviz Plan that export reads, for schedules built by hand."""

    profile: Profile
    schedule: Schedule
    graph: Graph
    budget_bytes: int | None = None
    strategy: str = "hand"
    model: dict[str, Any] | None = None

    @property
    def peak_bytes(self) -> int:
        return simulate(self.graph, self.schedule).peak_bytes


def _alive_before(graph: Graph, steps: list[Step], pos: int) -> set[int]:
    alive = {d.id for d in graph.datas if d.producer is None}
    for s in steps[:pos]:
        if s.op == "compute":
            alive.update(graph.computes[s.node].outputs)
        else:
            alive.discard(s.node)
    return alive


def remat_schedule(graph: Graph, boundary: int, every: int) -> tuple[Schedule, list[int]]:
    """The eager schedule with the saved outputs of every `every`-th forward producer freed when the
    forward pass ends and recomputed (with any freed input, recursively) before their first backward
    use; only insertions the simulator accepts are kept."""
    steps = list(eager_schedule(graph))
    chosen = []
    producers = list(dict.fromkeys(d.producer for d in graph.datas if d.kind is DataKind.SAVED))
    for c in producers[::every]:
        b = next(i for i, s in enumerate(steps) if s.op == "compute" and s.node == boundary)
        at_b = _alive_before(graph, steps, b)
        group = [o for o in graph.computes[c].outputs if o in at_b and graph.datas[o].kind is DataKind.SAVED]
        users = {u for o in group for u in graph.consumers(o)}
        p = next((i for i, s in enumerate(steps) if i > b and s.op == "compute" and s.node in users), None)
        if not group or p is None:
            continue
        alive = _alive_before(graph, steps, p) - set(group)
        recompute = _recompute_chain(graph, c, alive, depth=3)
        if recompute is None:
            continue
        temps = [o for r in recompute[:-1] for o in graph.computes[r].outputs if o not in alive]
        trial = (steps[:b] + [Step("free", o) for o in group] + steps[b:p]
                 + [Step("compute", r) for r in recompute] + [Step("free", o) for o in temps] + steps[p:])
        if simulate(graph, trial).valid:
            steps = trial
            chosen.append(c)
    return tuple(steps), chosen


def _recompute_chain(graph: Graph, c: int, alive: set[int], depth: int) -> list[int] | None:
    """Compute nodes to run (in order) so that `c` can run with `alive`; None if too deep."""
    node = graph.computes[c]
    # would duplicate a live tensor (new BatchNorm statistics excepted: a few bytes, copied back once;
    # a random op's 0-byte order token holds nothing)
    if any(o in alive and graph.datas[o].kind is not DataKind.BUFFER and graph.datas[o].bytes
           for o in node.outputs):
        return None
    chain: list[int] = []
    have = set(alive)
    for d in node.inputs:
        if d in have:
            continue
        if depth == 0 or graph.datas[d].producer is None:
            return None
        sub = _recompute_chain(graph, graph.datas[d].producer, have, depth - 1)
        if sub is None:
            return None
        chain += sub
        have |= {o for s in sub for o in graph.computes[s].outputs}
    return [*chain, c]


SCHEDULES = ("eager", "remat-half", "remat-all")


@functools.cache
def _profiled(name: str, dtype: torch.dtype) -> tuple[torch.nn.Module, tuple, Profile]:
    model, args = EXAMPLES[name](dtype=dtype)
    return model, args, profile(model, args, repeats=1, warmup=0, measure=False)


def _plan(prof: Profile, kind: str) -> HandPlan:
    graph = prof.graph
    if kind == "eager":
        schedule = prof.baseline_schedule
    else:
        every = 2 if kind == "remat-half" else 1
        schedule, chosen = remat_schedule(graph, prof.captured.loss_backward_compute, every)
        assert chosen, "the hand-made remat schedule recomputes nothing"
    grad_out = sum(graph.datas[d].bytes for d in prof.captured.tangent_data.values())
    # autograd keeps the output gradients referenced for the whole custom backward: a few bytes here
    budget = simulate(graph, schedule).peak_bytes + grad_out
    return HandPlan(prof, schedule, graph, budget)


def _train_step(module: torch.nn.Module, args: tuple, seed: int) -> Any:
    """One step whose outputs go once the loss has read them, as planned; returns their untracked copy."""
    torch.manual_seed(seed)
    out = module(*args)
    loss = default_loss(out)
    kept = Untracked.of(out)
    del out
    loss.backward()
    return kept


def _equal(a: Any, b: Any) -> bool:
    return torch.equal(Untracked.restored(a), Untracked.restored(b))


def _assert_same(a: Any, b: Any, what: str) -> None:
    a, b = Untracked.restored(a), Untracked.restored(b)
    if a.dtype == torch.float64 or not a.is_floating_point():
        assert torch.equal(a, b), what
    else:
        torch.testing.assert_close(a, b, rtol=1e-6, atol=0, msg=what)


FAST_CASES = [("gpt", torch.float64, "remat-all"), ("resnet", torch.float64, "remat-half"),
              ("vit", torch.float32, "remat-all"), ("unet", torch.float32, "eager")]


@pytest.mark.parametrize(("name", "dtype", "kind"), FAST_CASES)
def test_exported_matches_original_fast(name, dtype, kind):
    _check_exported(name, dtype, kind)


@pytest.mark.slow
@pytest.mark.parametrize("kind", SCHEDULES)
def test_exported_matches_original_and_plan(example_name, example_dtype, kind):
    """Every example x dtype x schedule (30 cases, ~3 minutes here)."""
    _check_exported(example_name, example_dtype, kind)


def _check_exported(example_name: str, example_dtype: torch.dtype, kind: str) -> None:
    """Issue 5 items 3-4: outputs, gradients and buffers equal over 3 SGD steps; measured peak within
    5% of the schedule's simulated peak and not above the budget."""
    model, args, prof = _profiled(example_name, example_dtype)
    plan = _plan(prof, kind)
    original = copy.deepcopy(model)
    exported = export(plan, model=copy.deepcopy(model))
    opt_a = torch.optim.SGD(original.parameters(), lr=0.05)
    opt_b = torch.optim.SGD(exported.parameters(), lr=0.05)
    outputs = []
    for step in range(3):
        out_a = _train_step(original, args, seed=step)
        run = functools.partial(_train_step, exported, args, step)
        peak, out_b = measure_peak(run, tensors_of(exported, args))
        _assert_same(out_a, out_b, f"output, step {step}")
        for (name, pa), pb in zip(original.named_parameters(), exported.parameters(), strict=True):
            _assert_same(pa.grad, pb.grad, f"grad of {name}, step {step}")
        for (name, ba), bb in zip(original.named_buffers(), exported.buffers(), strict=True):
            _assert_same(ba, bb, f"buffer {name}, step {step}")
        assert abs(peak - plan.peak_bytes) <= 0.05 * plan.peak_bytes, (peak, plan.peak_bytes)
        assert peak <= plan.budget_bytes, (peak, plan.budget_bytes)
        opt_a.step()
        opt_b.step()
        opt_a.zero_grad()
        opt_b.zero_grad()
        outputs.append(Untracked.restored(out_b))
    if example_name == "gpt":  # dropout on the output path: a fresh mask every step
        assert not torch.equal(outputs[0], outputs[1])


def test_recomputed_dropout_reuses_its_mask():
    model, args, prof = _profiled("gpt", torch.float64)
    plan = _plan(prof, "remat-all")
    recomputed = {s.node for i, s in enumerate(plan.schedule) if s.op == "compute"
                  and any(t.op == "compute" and t.node == s.node for t in plan.schedule[:i])}
    assert any("cpu_dropout" in prof.graph.computes[c].op for c in recomputed)
    exported = export(plan, model=copy.deepcopy(model))
    original = copy.deepcopy(model)
    _assert_same(_train_step(original, args, 3), _train_step(exported, args, 3), "output")
    for pa, pb in zip(original.parameters(), exported.parameters(), strict=True):
        _assert_same(pa.grad, pb.grad, "grad")
    # the global random stream advanced exactly as in eager mode (recomputations replay a fork)
    torch.manual_seed(5)
    original(*args)
    after_original = torch.get_rng_state()
    torch.manual_seed(5)
    default_loss(exported(*args)).backward()
    assert torch.equal(after_original, torch.get_rng_state())


def test_batchnorm_statistics_updated_once_per_step():
    model, args, prof = _profiled("resnet", torch.float64)
    plan = _plan(prof, "remat-all")
    bn_recomputed = [s for s in plan.schedule
                     if s.op == "compute" and "batch_norm" in prof.graph.computes[s.node].op]
    assert len(bn_recomputed) > len({s.node for s in bn_recomputed})  # some BatchNorm runs twice
    exported = export(plan, model=copy.deepcopy(model))
    # a first execution updates the statistics in place, as eager (no clones copied back); a
    # recomputation runs the functional form, whose new statistics nothing uses
    source = exported.program.source
    assert ".copy_(" not in source
    assert source.count("aten__native_batch_norm_legit(") == sum(isinstance(m, torch.nn.BatchNorm2d)
                                                                  for m in model.modules())
    assert "aten__native_batch_norm_legit_functional(" in source
    original = copy.deepcopy(model)
    before = exported._orig_mod.stem[1].num_batches_tracked.item()
    for step in range(2):
        _train_step(original, args, step)
        _train_step(exported, args, step)
    assert exported._orig_mod.stem[1].num_batches_tracked.item() == before + 2
    for (name, a), b in zip(original.named_buffers(), exported._orig_mod.buffers(), strict=True):
        assert torch.equal(a, b), name


def test_train_eval_switching_and_model_untouched():
    model, args = resnet()
    state = copy.deepcopy(model.state_dict())
    prof = profile(model, args, repeats=1, warmup=0, measure=False)
    exported = export(_plan(prof, "eager"))
    assert all(torch.equal(state[k], v) for k, v in model.state_dict().items())
    assert all(p.grad is None for p in model.parameters())
    assert not model._forward_hooks and not model._forward_pre_hooks
    reference = copy.deepcopy(model).eval()
    exported.eval()
    with torch.no_grad():
        assert torch.equal(exported(*args), reference(*args))
    exported.train()
    assert model.training
    out = exported(*args)
    assert out.grad_fn is not None


def test_stale_plans_and_other_shapes_are_refused():
    model, args = mlp()
    prof = profile(model, args, repeats=1, warmup=0, measure=False)
    plan = _plan(prof, "eager")
    exported = export(plan)
    with pytest.raises(StalePlanError, match="shape-specific"):
        exported(torch.randn(3, 32))
    other, _ = mlp(hidden=48)
    with pytest.raises(StalePlanError, match="differs"):
        stale = dataclasses.replace(plan, model={"fingerprint": prof.fingerprint, "mode": "train"})
        export(stale, model=other)


def test_parameters_and_modules_replaced_after_export_are_read():
    """The exported module keeps its walk over the model's parameters between steps (issue 22: the walk
    was 2% of a small step) and walks again once a parameter, buffer or submodule is set: a replaced
    parameter or submodule is what the next step reads, another shape is refused."""
    model, args = mlp()
    prof = profile(model, args, repeats=1, warmup=0, measure=False)
    exported = export(_plan(prof, "eager"))
    exported(*args)
    model.head.weight = torch.nn.Parameter(torch.randn_like(model.head.weight))
    assert torch.equal(exported(*args), model(*args))
    model.layers[1] = torch.nn.Linear(64, 64)
    assert torch.equal(exported(*args), model(*args))
    model.head.bias = torch.nn.Parameter(torch.zeros(11))
    with pytest.raises(StalePlanError, match="parameters changed"):
        exported(*args)


def test_source_export_round_trip(tmp_path):
    model, args = gpt(dtype=torch.float64)
    prof = profile(model, args, repeats=1, warmup=0, measure=False)
    plan = _plan(prof, "remat-half")
    target = tmp_path / "opt_model.py"
    export(plan, path=target)
    source = target.read_text()
    assert "torch.ops.aten.native_layer_norm.default" in source and "rng.replay(" in source
    assert "blocks.0.attn" in source and "models.py" in source  # module paths and source lines
    with pytest.raises(FileExistsError):
        export(plan, path=target)
    export(plan, path=target, overwrite=True)
    loaded = load_source(target, copy.deepcopy(model), plan=plan)
    original = copy.deepcopy(model)
    for step in range(2):
        _assert_same(_train_step(original, args, step), _train_step(loaded, args, step), "output")
        for pa, pb in zip(original.parameters(), loaded.parameters(), strict=True):
            _assert_same(pa.grad, pb.grad, "grad")
            pa.grad = pb.grad = None


def test_exported_module_runs_the_source_path_writes(tmp_path):
    """Issue 22: the module runs generated straight-line code, and ``path=`` writes that very code; each
    value (views included) is bound once per phase function when nothing is recomputed, frees are dels."""
    model, args = gpt(dtype=torch.float64)
    prof = profile(model, args, repeats=1, warmup=0, measure=False)
    plan = _plan(prof, "eager")
    target = tmp_path / "planned.py"
    exported = export(plan, path=target)
    source = exported.program.source
    assert target.read_text().endswith(source)
    assert exported.program.code.forward_steps.__code__.co_filename.startswith("<memviz plan")
    functions = re.split(r"^def ", source, flags=re.M)[1:]
    assert [f.split("(")[0] for f in functions] == ["forward_steps", "backward_steps", "backward_rest"]
    for body in functions:
        bound = re.findall(r"^ {4}(_\w+) = ", body, flags=re.M)
        assert bound and len(bound) == len(set(bound)), "a value was bound twice without a recomputation"
    assert re.search(r"^ {4}del _\w+.*# free ", source, flags=re.M)
    # each operator is the C++ operator itself, bound once: no OpOverload.__call__ frame per call
    ops = re.findall(r"^(\w+) = (torch\.ops\.\S+)$", source, flags=re.M)
    assert ops and all(path.endswith("._op") for _, path in ops)
    assert all(type(getattr(exported.program.code, name)).__name__ == "builtin_function_or_method"
               for name, _ in ops)
    _assert_same(_train_step(copy.deepcopy(model), args, 0), _train_step(exported, args, 0), "output")


def _plan_at_minimum(prof: Profile, strategy: str) -> Any:
    """memviz.plan at the smallest budget the solver reports feasible."""
    import memviz
    from solvers.result import InfeasibleBudget

    try:
        return memviz.plan(prof, int(prof.baseline.peak_bytes * 0.3), strategy=strategy, time_limit=600)
    except InfeasibleBudget as err:
        assert err.minimum_bytes is not None
        return memviz.plan(prof, err.minimum_bytes, strategy=strategy, time_limit=600)


@pytest.mark.parametrize(("name", "budget"), [("gpt", 0.9), ("gpt", 0.75), ("gpt", "min"), ("resnet", "min")])
def test_solver_plans_export_exactly(name, budget):
    """Plans from memviz.plan (Rockmate) at several budgets, the minimum feasible one included."""
    import memviz

    model, args, prof = _profiled(name, torch.float64)
    plan = (_plan_at_minimum(prof, "rockmate") if budget == "min"
            else memviz.plan(prof, budget, strategy="rockmate", time_limit=600))
    assert plan.timeline.recomputes > 0
    exported = export(plan, model=copy.deepcopy(model))
    original = copy.deepcopy(model)
    for step in range(3):
        out_a = _train_step(original, args, step)
        run = functools.partial(_train_step, exported, args, step)
        peak, out_b = measure_peak(run, tensors_of(exported, args))
        assert _equal(out_a, out_b)
        for pa, pb in zip(original.parameters(), exported.parameters(), strict=True):
            assert torch.equal(pa.grad, pb.grad)
            pa.grad = pb.grad = None
        assert abs(peak - plan.peak_bytes) <= 0.05 * plan.peak_bytes, (peak, plan.peak_bytes)
        assert peak <= plan.budget_bytes, (peak, plan.budget_bytes)
    # every buffer as eager left it, BatchNorm's num_batches_tracked too: nothing reads its new value,
    # so a solver skipped computing it (`planning.with_buffer_updates`)
    for (n, a), b in zip(original.named_buffers(), exported.buffers(), strict=True):
        assert torch.equal(a, b), n


def test_saved_plan_exports_with_the_model(tmp_path):
    """A plan loaded from JSON has no profile: export re-captures the given model and checks it."""
    import memviz

    model, args, prof = _profiled("resnet", torch.float64)
    plan = memviz.plan(prof, 0.9, strategy="rockmate", time_limit=600)
    plan.save(tmp_path / "plan.json")
    loaded = memviz.load_plan(tmp_path / "plan.json")
    exported = export(loaded, model=copy.deepcopy(model))
    original = copy.deepcopy(model)
    assert _equal(_train_step(original, args, 0), _train_step(exported, args, 0))
    for pa, pb in zip(original.parameters(), exported.parameters(), strict=True):
        assert torch.equal(pa.grad, pb.grad)
    other, _ = resnet(widths=(8, 24), dtype=torch.float64)
    with pytest.raises(StalePlanError):
        export(loaded, model=other)


def test_inputs_that_require_grad_get_their_gradient():
    import memviz

    model, (x,) = mlp(dtype=torch.float64)
    prof = profile(model, (x.clone().requires_grad_(True),), repeats=1, warmup=0)
    assert abs(prof.baseline.peak_bytes - prof.measured_peak_bytes) <= 0.05 * prof.measured_peak_bytes
    exported = export(memviz.plan(prof, None, strategy="none"), model=copy.deepcopy(model))
    xa, xb = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
    default_loss(model(xa)).backward()
    default_loss(exported(xb)).backward()
    assert torch.equal(xa.grad, xb.grad)


def test_torch_compile_backend_runs_a_plan():
    import memviz

    model, args = gpt(dtype=torch.float64)
    original = copy.deepcopy(model)
    compile_fn = memviz.backend(budget=0.9, strategy="rockmate", time_limit=600)
    compiled = torch.compile(copy.deepcopy(model), backend=compile_fn, dynamic=False)
    for step in range(2):
        assert _equal(_train_step(original, args, step), _train_step(compiled, args, step))
        for pa, pb in zip(original.parameters(), compiled.parameters(), strict=True):
            assert torch.equal(pa.grad, pb.grad)
            pa.grad = pb.grad = None
    (planned,) = compile_fn.plans
    assert simulate(planned.program.graph, (*planned.program.forward_steps,
                                            *planned.program.backward_steps)).recomputes > 0


def test_public_api_callable_after_submodule_imports():
    """`memviz.profile(...)` and `memviz.export(...)` work even when the submodules were imported first."""
    import memviz
    import memviz.profiling.profile
    import memviz.runtime.export

    model, args = mlp()
    prof = memviz.profile(model, args, repeats=1, warmup=0, measure=False)
    assert isinstance(memviz.export(memviz.plan(prof, None, strategy="none")), torch.nn.Module)


@pytest.mark.parametrize(("name", "mode"), [("gpt", "train"), ("resnet", "inference")])
def test_olla_plans_reorder_and_export_exactly(name, mode):
    """Issue 6 item 4: an OLLA plan reorders the operators (its peak below the eager order's), and the
    exported module runs that order: same outputs and gradients, measured peak within 5% of the plan."""
    import memviz

    model, args = EXAMPLES[name](dtype=torch.float64)
    prof = profile(model, args, mode=mode, repeats=1, warmup=0, measure=False)
    plan = memviz.plan(prof, None, strategy="olla", time_limit=600, frontier=False, packing=False)
    order = [s.node for s in plan.schedule if s.op == "compute"]
    assert order != [s.node for s in prof.baseline_schedule if s.op == "compute"]
    assert plan.peak_bytes < prof.baseline.peak_bytes
    exported, original = export(plan, model=copy.deepcopy(model)), copy.deepcopy(model)
    for step in range(3):
        if mode == "train":
            out_a = _train_step(original, args, step)
            peak, out_b = measure_peak(functools.partial(_train_step, exported, args, step),
                                       tensors_of(exported, args))
            for pa, pb in zip(original.parameters(), exported.parameters(), strict=True):
                assert torch.equal(pa.grad, pb.grad)
                pa.grad = pb.grad = None
        else:
            with torch.no_grad():
                torch.manual_seed(step)
                out_a = original(*args)
                torch.manual_seed(step)
                peak, out_b = measure_peak(lambda: exported(*args), tensors_of(exported, args))
        assert _equal(out_a, out_b)
        for ba, bb in zip(original.buffers(), exported.buffers(), strict=True):
            assert torch.equal(ba, bb)
        assert abs(peak - plan.peak_bytes) <= 0.05 * plan.peak_bytes, (peak, plan.peak_bytes)


def test_checkmate_plans_move_every_buffer_as_eager():
    """BatchNorm's ``num_batches_tracked + 1`` is read by nothing (eager adds in place), so Checkmate's
    schedules never computed it and the exported module left the count at 0 in the state_dict.
    `planning.with_buffer_updates` computes it first.  (With ``momentum=None`` BatchNorm reads the count
    as a Python float: the capture takes the example's value and says so in a ProfileWarning.)"""
    import memviz
    from memviz.plans.planning import minimum_budget

    torch.manual_seed(0)
    layers: list[torch.nn.Module] = []
    c = 3
    for w in (8, 16):
        layers += [torch.nn.Conv2d(c, w, 3, padding=1, bias=False), torch.nn.BatchNorm2d(w), torch.nn.ReLU()]
        c = w
    model = torch.nn.Sequential(*layers, torch.nn.Flatten(), torch.nn.Linear(16 * 8 * 8, 10))
    args = (torch.randn(4, 3, 8, 8),)
    prof = profile(model, args, mode="train", repeats=1, warmup=0, measure=False)
    low, high = minimum_budget(prof.graph, "rotor", 600), prof.baseline.peak_bytes
    plan = memviz.plan(prof, low + (high - low) // 2, strategy="checkmate", time_limit=600, frontier=False)
    assert plan.timeline.recomputes > 0
    original, exported = copy.deepcopy(model), export(plan, model=copy.deepcopy(model))
    for step in range(2):
        assert _equal(_train_step(original, args, step), _train_step(exported, args, step))
    for (n, a), b in zip(original.named_buffers(), exported.buffers(), strict=True):
        assert torch.equal(a, b), n


class _Float32Scores(torch.nn.Module):
    """Attention scores in float32 inside an autocast region, as GPT-2's upcast attention keeps them."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(32, 32)
        self.drop = torch.nn.Dropout(0.2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.drop(self.proj(x))
        with torch.autocast("cpu", enabled=False):
            scores = (h.float() @ h.float().transpose(-1, -2)).softmax(-1)
        return scores @ h


def test_a_step_profiled_under_autocast_runs_its_own_casts_whatever_the_callers_autocast() -> None:
    """Profiled inside ``torch.autocast``, the graph holds autocast's casts and the model's own float32
    regions.  Called inside autocast again, the exported step ran its float32 matmuls in bfloat16 (the
    model's ``autocast(enabled=False)`` is not in the graph, its casts are): a GPT-2 with dropout was 6-7e-3
    off, so `verify` refused it.  Now the step is the same inside and outside autocast, and is eager's step
    run as it was profiled (forward, loss and backward inside the region).  Profiling it replayed the
    graph's ops under autocast too (mixed dtypes in the float32 softmax's backward: a RuntimeError)."""
    model = _Float32Scores()
    x = torch.randn(2, 8, 32)

    def bf16() -> Any:
        return torch.autocast("cpu", dtype=torch.bfloat16)

    with bf16():
        prof = profile(model, (x,), repeats=1, warmup=0)
    assert any(d.dtype == "bfloat16" for d in prof.graph.datas)
    # eager's own step inside the region keeps the weight's bfloat16 copy in autocast's cache to its end:
    # predicted 12.4% under the measured step without it (the float32 block's saved inputs and its
    # backward's casts: tests/test_eager_holds.py)
    assert prof.baseline.peak_bytes == prof.measured_peak_bytes
    exported = export(memviz_plan(prof, None))

    def step(run: Any, inside: bool) -> dict[str, torch.Tensor]:
        model.zero_grad(set_to_none=True)
        torch.manual_seed(3)
        with bf16() if inside else contextlib.nullcontext():
            default_loss(run(x)).backward()
        return {n: p.grad.clone() for n, p in model.named_parameters()}

    eager = step(model, True)
    for inside in (True, False):
        got = step(exported, inside)
        for name, grad in eager.items():
            torch.testing.assert_close(got[name], grad, rtol=0, atol=0, msg=f"{name}, inside={inside}")


def test_a_plan_exported_onto_another_model_traces_it_with_inputs_on_that_models_device() -> None:
    """``memviz.export(plan, model=m)`` traces `m` again on zeros of the planned shapes: on `m`'s device,
    not the CPU's (an H200: a GPT-2 copy on the GPU failed its first ``index_select`` with a CPU index,
    `benchmarks/bench_cuda_compile.py`).  No GPU here: a model on the meta device stands for it."""
    from memviz.runtime.export import _example_inputs

    model, args = mlp()
    prof = profile(model, args, mode="train")
    plan = memviz_plan(prof, None, strategy="none")
    elsewhere = copy.deepcopy(model).to("meta")
    found, kwargs = _example_inputs(plan.graph, prof, elsewhere)
    tensors = [t for t in (*found, *kwargs.values()) if isinstance(t, torch.Tensor)]
    assert tensors and {t.device.type for t in tensors} == {"meta"}
    assert {t.device.type for t in _example_inputs(plan.graph, None, elsewhere)[0]} == {"meta"}
    assert {t.device.type for t in _example_inputs(plan.graph, prof)[0]} == {"cpu"}


class _SelfLabelled(torch.nn.Module):
    """A language model called as ``model(ids, labels=ids)``: its loss shifts a view of the labels."""

    def __init__(self, vocab: int = 64, d: int = 16) -> None:
        super().__init__()
        self.emb, self.head = torch.nn.Embedding(vocab, d), torch.nn.Linear(d, vocab)

    def forward(self, ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        logits = self.head(self.emb(ids.view(-1, ids.shape[-1])))
        return torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]),
                                                 labels[:, 1:].reshape(-1))


def test_a_plan_of_a_call_passing_one_tensor_twice_exports_onto_another_model() -> None:
    """``model(ids, labels=ids)`` passes one tensor twice, and the capture's view aliases follow the call's;
    tracing a copy again on two separate zero tensors made other aliases, and ``export(plan, model=copy)``
    refused its own plan as stale (HF GPT-2, seen on an H200 in `benchmarks/bench_cuda_compile.py`, and
    on the CPU).  The fresh trace passes one tensor there too."""
    torch.manual_seed(0)
    model, ids = _SelfLabelled(), torch.randint(0, 64, (2, 8))
    prof = profile(model, (ids,), {"labels": ids}, loss_fn=lambda loss: loss)
    assert prof.captured.input_shared == {1: 0}
    plan = memviz_plan(prof, None, strategy="none")
    copy_ = copy.deepcopy(model)
    exported = export(plan, model=copy_)
    torch.testing.assert_close(exported(ids, labels=ids), model(ids, labels=ids))
