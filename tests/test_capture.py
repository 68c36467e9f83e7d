"""Capture: the joint graph becomes a CD-graph with exact bytes, kinds, aliases and source locations,
and replaying it reproduces eager PyTorch bit for bit."""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
import torch.utils._pytree as pytree
from torch import nn

import memviz
from examples.models import gpt, mlp, resnet
from memviz.profiling.capture import CaptureError, Runner, capture, default_loss
from memviz.profiling.profile import ProfileWarning, profile
from solvers import DataKind, Phase, eager_schedule, simulate


def _by_name(graph):
    return {d.name: d for d in graph.datas}


def test_mlp_graph_shape_and_bytes():
    model, (x,) = mlp(batch=8, d_in=32, hidden=64, d_out=10, layers=3)
    graph, cap = capture(model, (x,))
    datas = _by_name(graph)
    # parameters: exact bytes from shapes, one data node each
    for name, p in model.named_parameters():
        assert datas[name].bytes == p.numel() * 4 and datas[name].kind is DataKind.PARAMETER
    assert datas["input0"].kind is DataKind.INPUT and datas["input0"].bytes == 8 * 32 * 4
    kinds = {d.kind for d in graph.datas}
    assert {DataKind.SAVED, DataKind.GRADIENT, DataKind.PARAMETER_GRADIENT, DataKind.OUTPUT} <= kinds
    # every parameter gradient is a required output with the parameter's size
    grads = [graph.datas[d] for d in graph.outputs if graph.datas[d].kind is DataKind.PARAMETER_GRADIENT]
    assert sorted(g.bytes for g in grads) == sorted(p.numel() * 4 for p in model.parameters())
    # views (t, view) are merged: no compute node is a view op
    assert not any(c.op.split(".")[1] in ("t", "view", "permute", "expand", "detach") for c in graph.computes
                   if c.op.startswith("aten."))
    assert any(d.aliases for d in graph.datas)
    phases = [c.phase for c in graph.computes]
    assert phases.index(Phase.BACKWARD) > phases.index(Phase.FORWARD)
    assert simulate(graph, eager_schedule(graph)).valid


def test_module_paths_and_source_lines():
    model, args = gpt()
    graph, _ = capture(model, args)
    fwd = [c for c in graph.computes if c.phase is Phase.FORWARD and c.name != "loss"]
    assert all(c.source for c in fwd)
    qkv = [c for c in fwd if c.module == "blocks.0.attn.qkv"]
    assert qkv and "models.py" in qkv[0].source and "self.qkv(x)" in qkv[0].source
    attn = [c for c in fwd if c.module == "blocks.0.attn"]
    assert any("models.py" in c.source and "q @ k.transpose" in c.source for c in attn)
    # backward nodes carry the module of the forward op they differentiate
    assert any(c.module == "blocks.1.fc" for c in graph.computes if c.phase is Phase.BACKWARD)


def test_tied_weights_share_one_data_node():
    model, args = gpt()
    graph, cap = capture(model, args)
    params = [d for d in graph.datas if d.kind is DataKind.PARAMETER]
    assert len(params) == len(list(model.parameters()))  # deduplicated like model.parameters()
    wte = _by_name(graph)["wte.weight"]
    assert "lm_head.weight" in wte.aliases
    assert set(cap.grad_data) == {n for n, _ in model.named_parameters()}


def test_multi_output_ops_and_dropout_noise():
    model, args = gpt()
    graph, _ = capture(model, args)
    ln = next(c for c in graph.computes if c.op == "aten.native_layer_norm.default")
    assert len(ln.outputs) == 3  # output, mean, rstd
    drop = next(c for c in graph.computes if c.op == "memviz.cpu_dropout.default")
    out, noise, token = (graph.datas[d] for d in drop.outputs)
    assert noise.bytes == out.bytes  # eager CPU dropout keeps a float noise tensor, not a bool mask
    assert noise.kind is DataKind.SAVED
    # the 0-byte token ordering the next random op after it (tests/test_rng_order.py)
    assert token.bytes == 0 and token.name.startswith("rng order: ") and token.id in graph.outputs


def test_batchnorm_buffers_are_updated_outputs():
    model, args = resnet()
    graph, cap = capture(model, args)
    updates = [k for k in cap.outputs if k and k[0] == "buffer"]
    assert {k[1] for k in updates} == {n for n, _ in model.named_buffers()}
    assert all(graph.datas[d].kind in (DataKind.BUFFER, DataKind.OUTPUT) for d in graph.outputs
               if graph.datas[d].producer is not None and graph.datas[d].name.startswith("add"))


def test_capture_does_not_modify_the_model():
    model, args = resnet()
    before = copy.deepcopy(model.state_dict())
    profile(model, args)
    after = model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert all(p.grad is None for p in model.parameters())


def _replay_eager(graph, cap, model, args):
    """Run the eager schedule through the Runner with the default loss's output gradients.  The model's
    outputs and new buffer values, which the schedule frees once read, are kept to be compared."""
    flat = pytree.tree_leaves((args, {}))
    runner = Runner(cap, cap.placeholder_values(model, flat))
    outs = pytree.tree_leaves(cap.gm.graph.output_node().args[0], is_leaf=lambda x: x is None)
    kept = {cap.data_of_fx.get(n.name) for n in outs if isinstance(n, torch.fx.Node)}
    for step in eager_schedule(graph):
        if step.op == "free":
            if step.node not in kept:
                runner.free(step.node)
        elif step.node == cap.loss_backward_compute:
            for d in cap.tangent_data.values():
                dtype = getattr(torch, graph.datas[d].dtype)
                runner.env[cap.data_fx[d]] = torch.ones((), dtype=dtype).expand(graph.datas[d].shape)
        elif step.node != cap.loss_compute:
            runner.compute(step.node)
    return {k: runner.value(n) for n, k in zip(outs, cap.outputs, strict=False) if k is not None}


def test_replay_is_bitwise_eager(example):
    name, model, args = example
    graph, cap = capture(model, args)
    ref = copy.deepcopy(model)
    torch.manual_seed(7)
    out = ref(*args)
    default_loss(out).backward()
    torch.manual_seed(7)
    got = _replay_eager(graph, cap, copy.deepcopy(model), args)
    assert torch.equal(got[("user", 0)], out)
    params = dict(ref.named_parameters())
    for key, value in got.items():
        if key[0] == "grad":
            assert torch.equal(value, params[cap.param_names[key[1]]].grad), key
        elif key[0] == "buffer":
            assert torch.equal(value, dict(ref.named_buffers())[key[1]]), key


class _Gate(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.lin(x)
        # leaves torch for numpy: no trace can follow it (a branch on a value is specialised instead)
        return y * float(y.detach().numpy().sum())


class _ValueGate(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.ones(8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.sum() > 0:  # a branch on a value: taken as the example input takes it
            return x * self.w * 2
        return x * self.w * 3


class _Outer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.pre = nn.Linear(8, 8)
        self.gate = _Gate()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.gate(torch.relu(self.pre(x)))


def test_untraceable_model_error_names_module_and_line():
    with pytest.raises(CaptureError) as info:
        profile(_Outer(), (torch.randn(4, 8),), fallback=False)
    assert info.value.module == "gate"
    assert info.value.source.endswith(f"test_capture.py:{_Gate.forward.__code__.co_firstlineno + 3}")


def test_value_branch_is_specialised_on_the_example_and_named():
    x, model = torch.ones(4, 8), _ValueGate()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        prof = profile(model, (x,), fallback=False, repeats=1, warmup=0)
    line = _ValueGate.forward.__code__.co_firstlineno + 1
    assert len(prof.specialised) == 1 and f"test_capture.py:{line}" in prof.specialised[0]
    assert prof.specialised[0].endswith("value True")
    assert any(f"test_capture.py:{line}" in str(w.message) for w in caught)
    out = memviz.export(memviz.plan(prof, 1.0, strategy="none"))(x)
    assert torch.equal(out, x * model.w * 2)


def test_untraceable_model_falls_back_to_hooks():
    model = _Outer()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        prof = profile(model, (torch.randn(4, 8),))
    assert any("module-level profile" in str(w.message) for w in caught)
    assert prof.fallback and prof.captured is None
    names = [c.name for c in prof.graph.computes]
    assert names == ["pre.forward", "gate.lin.forward", "gate.lin.backward", "pre.backward"]
    assert prof.baseline.valid and prof.baseline.peak_bytes > prof.graph.persistent_bytes()
    assert all(p.grad is None for p in model.parameters())
    with pytest.raises(ValueError, match="cannot be exported"):
        memviz.export(memviz.plan(prof, None, strategy="none", frontier=False))


class RandomBlocks(nn.Module):
    """Attends to randomly drawn columns with NumPy's generator, as BigBird's block-sparse attention does in
    training mode: eager draws new columns at every call."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        import numpy

        cols = torch.from_numpy(numpy.random.permutation(8)[:4].copy())
        return self.proj(x)[:, cols]


def test_draws_outside_torch_are_named_and_warned_about():
    import numpy

    numpy.random.seed(0)
    x = torch.randn(2, 8)
    _, cap = capture(RandomBlocks(), (x,))
    assert cap.host_random == ["numpy.random"]
    with pytest.warns(ProfileWarning, match=r"outside torch \(numpy.random\).*cannot match eager"):
        profile(RandomBlocks(), (x,), measure=False)
    _, plain = capture(*mlp())
    assert plain.host_random == []


class _ExpertLoop(nn.Module):
    """DBRX's mixture of experts: a Python loop over the experts ``nonzero()`` finds hit, each indexing the
    routing mask and its weights with a 0-d tensor (a read), after ``one_hot``, whose range check eager
    reads and the trace does not."""

    def __init__(self, experts: int = 4, width: int = 8) -> None:
        super().__init__()
        self.experts = experts
        self.router = nn.Linear(width, experts, bias=False)
        self.w = nn.Parameter(torch.randn(experts, width, width) / width ** 0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weights, chosen = self.router(x).softmax(-1).topk(2)
        out = torch.zeros_like(x)
        with torch.no_grad():
            mask = nn.functional.one_hot(chosen, self.experts + 1).permute(2, 1, 0)
            hit = (mask.sum(dim=(-1, -2)) > 0).nonzero()
        for e in hit:
            e = e[0]
            k, token = torch.where(mask[e])
            out.index_add_(0, token, (x[token] @ self.w[e]) * weights[token, k, None])
        return out


def test_expert_loop_over_nonzero_infers_as_eager_and_refuses_training_by_name():
    torch.manual_seed(0)
    model, x = _ExpertLoop().eval(), torch.randn(16, 8)
    prof = profile(model, (x,), mode="inference", fallback=False, repeats=1, warmup=0).with_costs("fake:v100")
    line = _ExpertLoop.forward.__code__.co_firstlineno + 5
    assert any(f"test_capture.py:{line}" in s and "aten.nonzero.default -> [(4, 1)]" in s
               for s in prof.specialised)
    exported = memviz.export(memviz.plan(prof, None, strategy="none", frontier=False))
    with torch.no_grad():
        assert torch.equal(exported(x), model(x))
    # training: the router's parameters size the experts' batches, which the next step changes
    with pytest.raises(CaptureError, match="sizes a tensor by values computed from its parameters") as info:
        profile(model.train(), (x,), fallback=False, measure=False)
    assert info.value.source.endswith(f"test_capture.py:{line + 3}")


class _SelfMasked(nn.Module):
    """Nystromformer's pattern: given no padding mask, the forward builds an all-ones one and asks
    transformers whether it must build the 4-d mask: ``is_tracing(mask)``, else eager reads ``mask.all()``
    and builds none (under export the mask is a fake tensor, which ``is_tracing`` counts as tracing)."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        from transformers import masking_utils

        mask = torch.ones(x.shape[:2]) if mask is None else mask
        y = self.lin(x)
        if not masking_utils.is_tracing(mask) and mask.all():
            return y
        square = mask[:, None, :] * mask[:, :, None]  # the 4-d mask's stand-in: (batch, seq, seq)
        return square @ y


def test_a_mask_the_forward_builds_is_read_as_eager_and_a_given_one_stays_traced():
    model, x = _SelfMasked(), torch.randn(2, 16, 8)

    def squares(cap) -> int:
        return sum(isinstance(v := n.meta.get("val"), torch.Tensor) and tuple(v.shape) == (2, 16, 16)
                   for n in cap.gm.graph.nodes)

    _, built = capture(model, (x,))
    assert squares(built) == 0
    assert any("mask.all()" in s and s.endswith("value True") for s in built.specialised)
    _, given = capture(model, (x, torch.ones(2, 16)))
    assert squares(given) > 0 and given.specialised == []


class _NamedExperts(nn.Module):
    """Switch Transformers' patterns: the router converts itself to a dtype it already has inside its
    forward, and the expert module is picked by a name formatted from a 0-d tensor."""

    def __init__(self) -> None:
        super().__init__()
        self.router = nn.Linear(8, 8)
        self.experts = nn.ModuleDict({f"expert_{i}": nn.Linear(8, 8) for i in range(2)})

    def forward(self, x: torch.Tensor, which: torch.Tensor) -> torch.Tensor:
        self.router = self.router.to(x.dtype)
        return self.experts[f"expert_{which[0]}"](self.router(x))


def test_a_same_dtype_conversion_and_a_formatted_index_trace_as_eager():
    torch.manual_seed(0)
    model, x, which = _NamedExperts(), torch.randn(4, 8), torch.tensor([1, 0])
    prof = profile(model, (x, which), fallback=False, repeats=1, warmup=0).with_costs("fake:v100")
    line = _NamedExperts.forward.__code__.co_firstlineno + 2
    assert any(f"test_capture.py:{line}" in s and s.endswith("value 1") for s in prof.specialised)
    exported = memviz.export(memviz.plan(prof, None, strategy="none", frontier=False))
    assert torch.equal(exported(x, which), model(x, which))


def test_autochunk_names_the_line_of_an_expert_loop_it_cannot_capture():
    model, x = _ExpertLoop().eval(), torch.randn(16, 8)
    prof = profile(model, (x,), mode="inference", fallback=False, repeats=1, warmup=0)
    with pytest.raises(CaptureError, match="autochunk cannot capture _ExpertLoop") as info:
        memviz.plan(prof, 0.5, strategy="autochunk", frontier=False)
    assert info.value.source.endswith(f"test_capture.py:{_ExpertLoop.forward.__code__.co_firstlineno + 6}")
