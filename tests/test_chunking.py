"""memviz.plans.chunking: capture, chunk selection, generated loops equal to eager, measured memory."""

from __future__ import annotations

import json
import math

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from memviz.plans import chunking as ch
from solvers import autochunk as ac

try:  # the project's live-storage tracker, when it has landed: an independent check of ours
    from memviz.profiling.tracker import StorageTracker, tensors_of
except ImportError:
    StorageTracker = None


# a fixed speed model keeps these tests deterministic on a loaded machine; the calibration is tested
# on its own and used by the benchmark
SPEED = ac.SpeedModel()


def measure(fn, *args):
    """(peak activation bytes, output): storages alive at once beyond parameters and inputs."""
    if StorageTracker is None:
        return ch.measure_activation_bytes(fn, *args)
    with torch.no_grad():
        tracker = StorageTracker(tensors_of(fn, args))
        with tracker:
            out = fn(*args)
    return tracker.peak_bytes - tracker.start_bytes, out


class GPTBlock(nn.Module):
    """Fused qkv Linear, split or unbind, explicit causal softmax attention, GELU MLP."""

    def __init__(self, C: int = 64, H: int = 4, unbind: bool = False, flip: bool = False) -> None:
        super().__init__()
        self.qkv, self.proj = nn.Linear(C, 3 * C), nn.Linear(C, C)
        self.ln1, self.ln2 = nn.LayerNorm(C), nn.LayerNorm(C)
        self.fc, self.fc2 = nn.Linear(C, 4 * C), nn.Linear(4 * C, C)
        self.H, self.unbind, self.flip = H, unbind, flip

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        H, D = self.H, C // self.H
        qkv = self.qkv(self.ln1(x))
        if self.unbind:
            q, k, v = qkv.view(B, T, 3, H, D).permute(2, 0, 3, 1, 4).unbind(0)
        else:
            q, k, v = (t.view(B, T, H, D).transpose(1, 2) for t in qkv.split(C, dim=2))
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(D))
        mask = torch.tril(torch.ones(T, T, dtype=torch.bool, device=x.device))
        att = att.masked_fill(~mask, float("-inf"))
        if self.flip:  # an op without a dimension rule in the middle of the peak
            att = torch.flip(att, dims=[0])
        att = F.softmax(att, dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
        x = x + self.proj(y)
        return x + self.fc2(F.gelu(self.fc(self.ln2(x))))


class SDPABlock(nn.Module):
    def __init__(self, C: int = 64, H: int = 4, causal: bool = False) -> None:
        super().__init__()
        self.qkv, self.proj, self.H, self.causal = nn.Linear(C, 3 * C), nn.Linear(C, C), H, causal
        self.mlp = nn.Sequential(nn.Linear(C, 8 * C), nn.GELU(), nn.Linear(8 * C, C))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = self.qkv(x).view(B, T, 3, self.H, C // self.H).permute(2, 0, 3, 1, 4).unbind(0)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=self.causal)
        x = x + self.proj(y.transpose(1, 2).reshape(B, T, C))
        return x + self.mlp(x)


class ViT(nn.Module):
    """Patch-embedding conv, class token, position embedding, encoder layers, head."""

    def __init__(self, C: int = 64, patch: int = 4) -> None:
        super().__init__()
        self.embed = nn.Conv2d(3, C, patch, stride=patch)
        self.cls = nn.Parameter(torch.randn(1, 1, C))
        self.layers = nn.ModuleList(
            nn.TransformerEncoderLayer(C, 4, 4 * C, batch_first=True, activation="gelu") for _ in range(2)
        )
        self.norm, self.head = nn.LayerNorm(C), nn.Linear(C, 10)

    def forward(self, img: torch.Tensor) -> torch.Tensor:
        x = self.embed(img).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls.expand(x.shape[0], -1, -1), x], dim=1)
        for layer in self.layers:
            x = layer(x)
        return self.head(self.norm(x)[:, 0])


class ConvNet(nn.Module):
    """UNet-ish: conv, BatchNorm, ReLU, pooling, upsampling, GroupNorm, skip connection."""

    def __init__(self) -> None:
        super().__init__()
        self.down = nn.Sequential(nn.Conv2d(3, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU())
        self.mid = nn.Sequential(
            nn.MaxPool2d(2),
            nn.Conv2d(32, 64, 3, padding=1),
            nn.SiLU(),
            nn.Upsample(scale_factor=2),
            nn.Conv2d(64, 32, 3, padding=1),
        )
        self.out = nn.Sequential(nn.GroupNorm(4, 32), nn.Conv2d(32, 3, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.down(x)
        return self.out(h + self.mid(h))


class MQABlock(nn.Module):
    """Multi-query attention as Falcon writes it: one key/value head broadcast over the query heads."""

    def __init__(self, C: int = 64, H: int = 4, causal: bool = False) -> None:
        super().__init__()
        self.q, self.kv, self.proj = nn.Linear(C, C), nn.Linear(C, 2 * C // H), nn.Linear(C, C)
        self.H, self.causal = H, causal

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        D = C // self.H
        q = self.q(x).view(B, T, self.H, D).transpose(1, 2)
        k, v = (t.view(B, T, 1, D).transpose(1, 2) for t in self.kv(x).split(D, dim=2))
        if self.causal:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            mask = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()[None, None]
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return self.proj(y.transpose(1, 2).reshape(B, T, C))


class DroppedState(nn.Module):
    """A recurrence's states (a cumulative sum), its last state taken as the cache and dropped
    (``use_cache=False``: Mamba2's chunked scan), then an MLP that peaks."""

    def __init__(self, C: int = 32, S: int = 4) -> None:
        super().__init__()
        self.inp, self.out = nn.Linear(C, S * C), nn.Linear(S * C, C)
        self.mlp = nn.Sequential(nn.Linear(C, 8 * C), nn.GELU(), nn.Linear(8 * C, C))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        states = torch.cumsum(self.inp(x), dim=1)
        last = states[:, -1]  # noqa: F841 - the cache nobody reads
        return self.mlp(self.out(F.gelu(states)))


def _check(model: nn.Module, args: tuple, budget: float, *, expect_regions: bool = True) -> ch.ChunkPlan:
    torch.manual_seed(0)
    model = model.eval()
    with torch.no_grad():
        ref = model(*args)
    plan = ch.plan_chunks(model, args, budget=budget, speed=SPEED)
    # eager baseline: the exported graph run op by op (nn.TransformerEncoderLayer's fused fast path
    # would hide its intermediates from a dispatch-level tracker)
    eager_peak, _ = measure(plan.gm, *args)
    assert abs(eager_peak - plan.baseline_peak_bytes) <= 0.05 * eager_peak
    if expect_regions:
        assert plan.regions, "no region found"
    gm = plan.module()
    if plan.regions:
        assert "for _lo0 in range(" in gm.code
    peak, out = measure(gm, *args)
    assert out.shape == ref.shape
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    if plan.regions:
        assert peak < eager_peak
        # the estimate replays the generated code's allocations: within 5% of the measured peak
        assert abs(peak - plan.peak_bytes) <= 0.05 * peak, (peak, plan.peak_bytes)
    return plan


def test_gpt_block_fused_qkv_split():
    plan = _check(nn.Sequential(GPTBlock(), GPTBlock()), (torch.randn(1, 256, 64),), 0.3)
    assert plan.met and plan.peak_bytes <= plan.budget_bytes
    assert plan.peak_bytes < 0.3 * plan.baseline_peak_bytes + 1


def test_gpt_block_fused_qkv_unbind():
    plan = _check(GPTBlock(unbind=True), (torch.randn(2, 128, 64),), 0.4)
    assert plan.met


def test_sdpa_block_and_causal_sdpa_not_chunked_over_queries():
    _check(SDPABlock(), (torch.randn(1, 256, 64),), 0.5)
    plan = ch.plan_chunks(SDPABlock(causal=True).eval(), (torch.randn(1, 256, 64),), budget=0.5, speed=SPEED)
    for r in plan.regions:
        for name, d in r.flow.dims.items():
            if plan.graph[name].op == "scaled_dot_product_attention":
                assert d != 2, "is_causal ties queries to keys: chunking queries would be wrong"


@pytest.mark.parametrize(("causal", "chunks"), [(False, 4), (True, 4), (False, 2), (True, 2)])
def test_head_chunks_of_multi_query_attention_are_estimated_with_their_kernel(causal, chunks):
    """The broadcast key/value head sends the whole attention to SDPA's math kernel (L x S scores);
    a one-head chunk matches it and runs the fused kernel.  Estimated with the whole op's kernel, the
    chunks were counted with scores they never hold (+106% bool mask, +334% is_causal at 4 chunks;
    Falcon's plan in `benchmarks/check_unseen_hf.py --size deep` measured 35% under).  Two-head chunks
    stay on the math kernel, whose is_causal mask is L x S in every chunk (it was counted shrunk:
    6.5% under)."""
    torch.manual_seed(0)
    model, x = MQABlock(causal=causal).eval(), torch.randn(1, 256, 64)
    gm, g = ch.capture(model, (x,))
    attn = next(n for n in g.nodes if n.op == "scaled_dot_product_attention")
    assert attn.backend == "math"
    plan = ch.ChunkPlan(g, [], SPEED, None, 0, 0, gm).with_chunks(
        [{"start": attn.name, "end": attn.name, "chunks": chunks, "outputs": {attn.name: 1}}])
    peak, out = measure(plan.module(), x)
    with torch.no_grad():
        torch.testing.assert_close(out, model(x), rtol=1e-5, atol=1e-5)
    assert abs(peak - plan.peak_bytes) <= 0.05 * peak, (peak, plan.peak_bytes)


def test_gelu_mlp():
    mlp = nn.Sequential(nn.Linear(32, 512), nn.GELU(), nn.Linear(512, 32))
    _check(mlp, (torch.randn(4, 256, 32),), 0.4)


def test_transformer_encoder_layer():
    layer = nn.TransformerEncoderLayer(64, 4, 256, batch_first=True)
    _check(layer, (torch.randn(2, 128, 64),), 0.4)


def test_vit():
    _check(ViT(), (torch.randn(2, 3, 32, 32),), 0.5)


def _example_vit(explicit: bool) -> tuple[nn.Module, torch.Tensor]:
    """examples.models.vit (fused qkv, scaled_dot_product_attention), or the same weights with explicit
    softmax(q k^T) v attention (the benchmark's ExplicitAttentionBlock)."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    from bench_autochunk import ExplicitAttentionBlock

    from examples.models import vit

    model, (img,) = vit(batch=1, image=64, patch=4, d=64, heads=4, layers=2, dropout=0.0)
    if explicit:
        for blk in model.blocks:
            blk.__class__ = ExplicitAttentionBlock
    return model.eval(), img


def test_example_vit_fused_attention_reaches_its_floor():
    """Fused attention keeps the block input, the fused qkv output (3 T.C) and the attention output
    whole: 5 of the MLP's 9 T.C.  Selection reaches that floor and chunks no finer than it needs."""
    model, img = _example_vit(False)
    plan = _check(model, (img,), 0.2)
    assert not plan.met
    tc = 257 * 64 * 4
    assert plan.baseline_peak_bytes == pytest.approx(9 * tc, rel=0.02)
    assert plan.peak_bytes == pytest.approx(5 * tc, rel=0.02)
    chunks = plan.chunks
    for i in range(len(chunks)):  # one chunk fewer and the MLP would be the peak again
        fewer = plan.with_chunks([dict(d, chunks=d["chunks"] - (j == i)) for j, d in enumerate(chunks)])
        assert fewer.peak_bytes > plan.peak_bytes


def test_example_vit_explicit_attention_chunks_queries():
    model, img = _example_vit(True)
    plan = _check(model, (img,), 0.3)
    assert plan.met
    ops = {plan.graph[x].op for r in plan.regions for x in r.flow.dims}
    assert "softmax" in ops  # the scores are chunked along the queries


def test_convnet_batch_chunks():
    plan = _check(ConvNet(), (torch.randn(4, 3, 32, 32),), 0.6)
    dims = {d for r in plan.regions for d in r.flow.dims.values()}
    assert dims <= {0, 1}  # batch or channels: never a spatial dim a conv mixes


def test_a_value_nothing_reads_is_freed_where_it_is_made():
    """The dropped last state is a view of all the states: the chunked code kept it (so the states) to
    the end of the run, where FX's code and the estimate free it at once.  Mamba2's chunk plan measured
    12.9% over its estimate (`benchmarks/check_unseen_hf.py --models mamba2`); this one 42% before."""
    plan = _check(DroppedState(), (torch.randn(1, 256, 32),), 0.6)
    assert plan.met


def test_every_candidate_region_around_the_peak_generates_correct_code():
    torch.manual_seed(0)
    model, x = GPTBlock().eval(), torch.randn(1, 64, 64)
    with torch.no_grad():
        ref = model(x)
    plan = ch.plan_chunks(model, (x,), budget=1.0, speed=SPEED)
    flows = ac.candidates_around(plan.graph, ac.estimate_memory(plan.graph).peak_node, (), window=12)
    assert len(flows) > 20
    for f in flows[:: max(1, len(flows) // 40)]:
        region = {"start": f.start, "end": f.end, "outputs": f.outputs, "chunks": 3}
        gm = plan.with_chunks([region]).module()
        with torch.no_grad():
            torch.testing.assert_close(gm(x), ref, rtol=1e-5, atol=1e-5, msg=lambda m, r=region: f"{r}: {m}")


def test_unknown_op_ends_regions_without_crashing():
    plan = _check(GPTBlock(flip=True), (torch.randn(1, 128, 64),), 0.5, expect_regions=False)
    for r in plan.regions:
        assert not any(plan.graph[n].op == "flip" for n in r.flow.dims)


def test_illegal_edit_is_rejected_naming_the_op():
    plan = ch.plan_chunks(GPTBlock().eval(), (torch.randn(1, 128, 64),), budget=0.3, speed=SPEED)
    region = next(c for c in plan.chunks if any(plan.graph[n].op == "softmax" for n in c["dims"]))
    softmax = next(n for n in region["dims"] if plan.graph[n].op == "softmax")
    edited = dict(region, dims={**region["dims"], softmax: 3})
    with pytest.raises(ValueError, match="softmax"):
        plan.with_chunks([edited])
    # the output dim along the keys: the flow breaks at the softmax over that dim
    out, _ = next(iter(region["outputs"].items())), None
    with pytest.raises(ValueError, match="chunk"):
        plan.with_chunks([{**region, "outputs": {out[0]: len(plan.graph[out[0]].shape)}}])
    with pytest.raises(ValueError, match="overlap"):
        plan.with_chunks([region, region])


def test_user_edit_reestimates_and_round_trips():
    torch.manual_seed(0)
    model, x = GPTBlock().eval(), torch.randn(1, 128, 64)
    plan = ch.plan_chunks(model, (x,), budget=0.3, speed=SPEED)
    edited = [dict(c, chunks=2) for c in plan.chunks]
    p2 = plan.with_chunks(edited)
    assert [c["chunks"] for c in p2.chunks] == [2] * len(edited)
    assert p2.peak_bytes >= plan.peak_bytes
    blob = json.loads(json.dumps(p2.to_dict()))
    p3 = ch.ChunkPlan.from_dict(blob, gm=plan.gm)
    assert p3.chunks == p2.chunks and p3.peak_bytes == p2.peak_bytes
    with torch.no_grad():
        torch.testing.assert_close(p3.module()(x), model(x), rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="rebuild"):
        ch.ChunkPlan.from_dict(blob).module()


def test_calibrated_speed_model_is_measured():
    m = ch.calibrate("cpu")
    assert 0 < m.overhead_s < 1e-3 and m.bandwidth > 1e8
    rates = [r for _, r in m.matmul_rate]
    assert rates == sorted(rates) and rates[0] > 0
    assert m.page_s >= 0 and m.fresh_from > 0


def test_every_op_is_timed_on_the_device():
    model, x = GPTBlock().eval(), torch.randn(1, 128, 64)
    gm, g = ch.capture(model, (x,))
    timed = ch.measure_times(gm, g, (x,), rounds=2)
    ops = [n for n in timed.nodes if n.op not in ("input",) and not n.op.startswith("call_module")]
    assert ops and all(n.time > 0 and n.fresh >= 0 for n in ops)
    assert [(n.name, n.shapes) for n in timed.nodes] == [(n.name, n.shapes) for n in g.nodes]
    # a whole op costs what it measured (nothing is guessed for it), so the run is estimated slower
    # than the measured ops alone
    speed = ac.SpeedModel()
    assert all(ac.node_time(timed, n, speed) == n.time for n in ops if n.alias is None)
    assert ac.graph_time(timed, speed) >= sum(n.time for n in ops if n.alias is None)


# --------------------------------------------------------------------------------------------------
# memviz.plan(profile, budget, strategy="autochunk"): the chunked run as a memviz Plan
# --------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def gpt_inference():
    """The GPT example in inference at a long sequence (512 tokens: the causal scores dominate)."""
    import memviz
    from examples.models import gpt

    model, args = gpt(batch=1, seq=512, d=64, heads=4, layers=2, vocab=128, dropout=0.0)
    model.eval()
    prof = memviz.profile(model, args, mode="inference")
    return model, args, prof, memviz.plan(prof, 0.4, strategy="autochunk")


def _persistent(plan) -> int:
    return plan.baseline_graph.persistent_bytes()


def test_plan_autochunk_fits_budget_and_export_equals_eager(gpt_inference):
    import memviz
    from solvers import simulate

    model, args, prof, plan = gpt_inference
    assert plan.strategy == "autochunk" and plan.chunks
    assert plan.peak_bytes <= plan.budget_bytes < plan.baseline.peak_bytes
    assert plan.budget_bytes == int(0.4 * plan.baseline.peak_bytes)
    # both runs are checked by the simulator: valid, and the recorded timelines are its output
    assert simulate(plan.graph, plan.schedule).check().step_bytes == plan.timeline.step_bytes
    base = simulate(plan.baseline_graph, plan.baseline_schedule).check()
    assert base.peak_bytes == plan.baseline.peak_bytes
    # the simulated run agrees with the chunk estimator (activations) plus parameters and inputs
    assert plan.peak_bytes == plan.chunk_plan().peak_bytes + _persistent(plan)
    for c in plan.chunks:
        assert {"start", "end", "dims", "chunks", "memory_bytes", "slowdown"} <= set(c)
        assert c["chunks"] >= 2 and 0 < c["memory_bytes"] <= plan.peak_bytes and math.isfinite(c["slowdown"])
    # the simulated chunked run takes the estimated slowdown longer (negative: the chunks avoid page
    # faults the whole ops paid in the measured run)
    assert plan.time_overhead == pytest.approx(1.0 + plan.chunk_plan().slowdown, rel=1e-6)
    assert plan.packing is not None
    opt = memviz.export(plan)
    assert "for _lo0 in range(" in opt.chunked.code
    with torch.no_grad():
        ref = model(*args)
    peak, out = measure(opt, *args)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    # the plan's activation bytes are what the exported module really holds (live-storage tracker)
    predicted = plan.peak_bytes - _persistent(plan)
    assert abs(peak - predicted) <= 0.05 * peak, (peak, predicted)
    assert peak + _persistent(plan) <= plan.budget_bytes  # measured, parameters and inputs included
    eager_peak, _ = measure(model, *args)
    assert peak < 0.6 * eager_peak


def test_plan_with_chunks_revalidates_and_names_the_breaking_op(gpt_inference):
    from solvers import simulate

    _, _, _, plan = gpt_inference
    fewer = plan.with_chunks([dict(c, chunks=2) for c in plan.chunks])
    assert [c["chunks"] for c in fewer.chunks] == [2] * len(plan.chunks)
    assert fewer.peak_bytes > plan.peak_bytes and fewer.baseline.peak_bytes == plan.baseline.peak_bytes
    simulate(fewer.graph, fewer.schedule).check()
    g = plan.chunk_plan().graph
    region = next(c for c in plan.chunks if any(g[n].op == "softmax" for n in c["dims"]))
    softmax = next(n for n in region["dims"] if g[n].op == "softmax")
    with pytest.raises(ValueError, match="softmax"):  # chunking over the normalised dim
        plan.with_chunks([{"start": region["start"], "end": softmax, "chunks": 4, "outputs": {softmax: 3}}])


def test_plan_autochunk_save_load_export(gpt_inference, tmp_path):
    import memviz
    from examples.models import gpt
    from memviz.runtime.export import StalePlanError

    model, args, _, plan = gpt_inference
    path = plan.save(tmp_path / "chunked.json")
    loaded = memviz.load_plan(path)
    assert loaded.strategy == "autochunk" and loaded.chunks == plan.chunks
    assert loaded.timeline.step_bytes == plan.timeline.step_bytes
    assert loaded.baseline.step_bytes == plan.baseline.step_bytes
    with pytest.raises(ValueError, match="model="):
        memviz.export(loaded)
    opt = memviz.export(loaded, model=model, path=tmp_path / "chunked.py")
    with torch.no_grad():
        torch.testing.assert_close(opt(*args), model(*args), rtol=1e-5, atol=1e-5)
    assert "for _lo0 in range(" in (tmp_path / "chunked.py").read_text()
    # edits after loading need no model: the op graph and speed model travel in the JSON
    assert loaded.with_chunks([dict(c, chunks=2) for c in loaded.chunks]).peak_bytes > loaded.peak_bytes
    other, _ = gpt(batch=1, seq=512, d=32, heads=4, layers=2, vocab=128, dropout=0.0)
    with pytest.raises(StalePlanError):
        memviz.export(loaded, model=other.eval())
    with pytest.raises(StalePlanError, match="shape"):
        opt(torch.zeros(1, 256, dtype=torch.long))


def test_autochunk_meets_the_minimum_its_refusal_named(gpt_inference):
    """The sweep's fault (`benchmarks/NOTES_unseen_hf.md`, olmo, phi, vit under load): refused at 0.5
    with a named minimum, `plan` at that minimum was refused again with a larger one, because the second
    search was cut by its time limit before it reached the regions the first had found.  Here the cut is
    certain (time_limit=0: no region is tried), so the plan at the minimum has to come from what the
    first call found; the assertion holds whatever the measured op times make the selection choose."""
    import memviz
    from solvers.result import InfeasibleBudget

    _, _, prof, _ = gpt_inference
    with pytest.raises(InfeasibleBudget) as refused:
        memviz.plan(prof, 0.1, strategy="autochunk")
    minimum = refused.value.minimum_bytes
    assert minimum < prof.baseline.peak_bytes  # regions were found: the minimum is theirs
    plan = memviz.plan(prof, minimum, strategy="autochunk", time_limit=0.0)
    assert plan.chunks and plan.peak_bytes <= minimum
    # a later refusal names that minimum again, not what its own (cut) search reached
    with pytest.raises(InfeasibleBudget) as again:
        memviz.plan(prof, 0.1, strategy="autochunk", time_limit=0.0)
    assert again.value.minimum_bytes == minimum


def test_a_chunk_plan_measuring_over_its_estimate_is_refused(gpt_inference, monkeypatch):
    """The truth rule for chunk plans: the measured check (`ChunkPlan.checked`) refuses a chunked run
    that measures over its estimate by more than the chunking tests' 5% (Mamba2's and RecurrentGemma's
    plans were returned 6.6-12.9% over).  The chunked code here holds a temporary the estimate does not
    know, a quarter of the estimated peak while the loops run."""
    import memviz
    from memviz.plans.planning import PlanningError

    _, _, prof, _ = gpt_inference
    real = ch.ChunkPlan.module

    def with_unestimated_temporary(self: ch.ChunkPlan) -> torch.nn.Module:
        gm, extra = real(self), self.peak_bytes // 4

        class Leaky(nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.gm = gm

            def forward(self, *args: torch.Tensor) -> torch.Tensor:
                temporary = torch.empty(extra, dtype=torch.uint8)
                out = self.gm(*args)
                del temporary
                return out

        return Leaky()

    monkeypatch.setattr(ch.ChunkPlan, "module", with_unestimated_temporary)
    with pytest.raises(PlanningError, match=r"measured \d+ bytes of activations, 2\d\.\d% over"):
        memviz.plan(prof, 0.4, strategy="autochunk", frontier=False)


def test_a_profile_is_captured_and_timed_once_for_every_plan_on_it(monkeypatch):
    """`memviz.plan(strategy="autochunk")` exported and timed the model on every call: Mamba's
    selective scan (5,324 ops at 256 tokens) took 151 s to capture under load, twice in the sweep (the
    refusal at 0.5, then the plan at its minimum).  Once per profile now, which also keeps a profile's
    plans on the same op times (the selection ranks regions by them)."""
    import memviz
    from examples.models import gpt
    from solvers.result import InfeasibleBudget

    captured, timed = [], []
    capture, measure = ch.capture, ch.measure_times
    monkeypatch.setattr(ch, "capture", lambda *a, **k: captured.append(1) or capture(*a, **k))
    monkeypatch.setattr(ch, "measure_times", lambda *a, **k: timed.append(1) or measure(*a, **k))
    model, args = gpt(batch=1, seq=128, d=32, heads=4, layers=1, vocab=64, dropout=0.0)
    prof = memviz.profile(model.eval(), args, mode="inference", repeats=1, warmup=0)
    peaks = []
    for _ in range(2):
        try:
            peaks.append(memviz.plan(prof, 0.5, strategy="autochunk", frontier=False).peak_bytes)
        except InfeasibleBudget as err:
            peaks.append(err.minimum_bytes)
    assert len(captured) == len(timed) == 1 and peaks[0] == peaks[1]


def test_plan_autochunk_refuses_training_profiles():
    import memviz
    from examples.models import gpt
    from memviz.plans.planning import PlanningError

    model, args = gpt(batch=1, seq=16, d=32, heads=4, layers=1, vocab=64, dropout=0.0)
    prof = memviz.profile(model, args, mode="train", measure=False)
    with pytest.raises(PlanningError, match="inference") as e:
        memviz.plan(prof, 0.5, strategy="autochunk")
    assert "rockmate" in str(e.value)
    with pytest.raises(PlanningError, match="memviz.profile"):
        memviz.plan(prof.graph, 0.5, strategy="autochunk")


def test_auto_chunks_inference_that_reordering_cannot_fit(gpt_inference):
    import memviz

    _, _, prof, plan = gpt_inference
    auto = memviz.plan(prof, plan.budget_bytes, time_limit=10.0)
    assert auto.strategy == "autochunk" and auto.peak_bytes <= plan.budget_bytes


def test_benchmark_allocator_counter_agrees_with_the_storage_tracker():
    """bench_autochunk measures inductor's compiled code with the CPU allocator's profiler events (a
    dispatch-mode tracker cannot see inside it): on eager code both must give the same peak."""
    from memviz.profiling.tracker import allocator_peak

    torch.manual_seed(0)
    plan = ch.plan_chunks(GPTBlock().eval(), (torch.randn(1, 256, 64),), budget=0.3, speed=SPEED)
    x = torch.randn(1, 256, 64)
    for fn in (plan.gm, plan.module()):
        with torch.no_grad():
            tracked, _ = ch.measure_activation_bytes(fn, x)
            counted, _ = allocator_peak(lambda fn=fn: fn(x))
        # the allocator also counts a few bytes the tracker does not (small allocations that are not
        # op outputs: 12 bytes on this block)
        assert tracked > 0 and abs(counted - tracked) <= 0.01 * tracked, (counted, tracked)


def test_planning_leaves_batchnorm_statistics_of_a_train_mode_model_as_they_were():
    """Planning runs the captured inference graph (op timing, measured peaks), whose train-mode BatchNorm
    updates the user's running statistics in place: they moved once per measuring run, so the exported
    model no longer matched eager (torchvision's DenseNet in `benchmarks/check_unseen_vision.py`)."""
    import copy

    import memviz

    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU(), nn.Conv2d(8, 4, 3)).train()
    x = torch.randn(4, 3, 24, 24)
    before = copy.deepcopy(model)
    prof = memviz.profile(model, (x,), mode="inference", repeats=1, warmup=0)
    plan = memviz.plan(prof, prof.baseline.peak_bytes, strategy="autochunk")
    ch._measured_activation_bytes(plan.chunk_plan().gm, [x])  # what `ChunkPlan.checked` runs
    for (name, a), b in zip(before.named_buffers(), model.buffers(), strict=True):
        assert torch.equal(a, b), name
    exported = memviz.export(plan)
    with torch.no_grad():
        torch.testing.assert_close(exported(x), before(x), rtol=1e-6, atol=0)
    for (name, a), b in zip(before.named_buffers(), exported.buffers(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=0, msg=name)
