"""An estimated parallel rank (``device="fake:..."``: the step runs on fake tensors) records what the same
step runs on real tensors (issue 20 item 6).  transformers' ``is_tracing`` counts a fake tensor as tracing,
so on fake tensors its ``masking_utils`` built the S x S causal mask (and the packed-sequence ids) an eager
step on real tensors skips: `memviz.profiling.capture.eager_attention_masks` with ``fake=True``."""

from __future__ import annotations

import pytest
import torch

import memviz
from memviz.parallel.distributed import Parallel, ParallelError
from tests.distributed_worker import loss_of, tiny_llama


def _tiny_gpt2():
    from tests.real_models import transformers  # after torchvision's schema shim

    torch.manual_seed(0)
    cfg = transformers.GPT2Config(n_embd=32, n_layer=2, n_head=4, vocab_size=64, n_positions=64,
                                  use_cache=False)
    return transformers.GPT2LMHeadModel(cfg), (torch.randint(0, 64, (2, 16)),)


@pytest.mark.parametrize("build", [tiny_llama, _tiny_gpt2], ids=["llama", "gpt2"])
def test_an_estimated_rank_runs_what_real_tensors_run(build):
    """Same operators in the same order (no mask built) and the same predicted peak, to the byte, as the
    rank recorded on real tensors; without the fix both ran more (the mask, the packed-sequence ids)."""
    model, args = build()
    real = memviz.profile(model, args, loss_fn=loss_of, parallel=Parallel(2))
    est = memviz.profile(model, args, loss_fn=loss_of, parallel=Parallel(2), device="fake:h100")
    assert est.graph.meta["estimated"] and not real.graph.meta["estimated"]
    assert [c.op for c in est.graph.computes] == [c.op for c in real.graph.computes]
    assert est.baseline.peak_bytes == real.baseline.peak_bytes
    masks = [d for d in est.graph.datas if len(d.shape) == 4 and d.shape[1] == 1 and d.shape[2:] == (16, 16)]
    assert not masks  # no (batch, 1, seq, seq) mask


def test_a_read_of_a_fake_value_names_the_inputs():
    """A padding mask is read by value (``fast_all``) to decide whether eager needs the causal mask: on
    fake tensors it has no value, so the estimate refuses and names the inputs (before: the traced branch,
    a mask eager does not build for an all-ones padding mask)."""
    model, (ids,) = tiny_llama()
    with pytest.raises(ParallelError, match=r"reads the values of a tensor at .*masking_utils.*"
                                            r"\(input_ids, attention_mask\)"):
        memviz.profile(model, (ids,), {"attention_mask": torch.ones_like(ids)}, loss_fn=loss_of,
                       parallel=Parallel(2), device="fake:h100")


def test_an_estimated_rank_leaves_older_objects_out_of_collections(monkeypatch):
    """While the estimated step records, the objects that existed before it (model, libraries) are frozen
    out of the garbage collector's traversals (the collections were a tenth of a Llama-3-8B rank's CPU
    time); afterwards they are unfrozen, and a process that froze objects itself keeps its freeze."""
    import gc

    from memviz.parallel import distributed

    seen = []
    record = distributed.record_step
    monkeypatch.setattr(distributed, "record_step", lambda *a, **k: (seen.append(gc.get_freeze_count()),
                                                                    record(*a, **k))[1])
    model, args = tiny_llama()
    before = gc.get_freeze_count()
    memviz.profile(model, args, loss_fn=loss_of, parallel=Parallel(2), device="fake:h100")
    assert seen[0] > before and gc.get_freeze_count() == before
    memviz.profile(model, args, loss_fn=loss_of, parallel=Parallel(2))  # on real tensors: no freeze
    assert seen[1] == before


def test_an_estimated_cuda_rank_runs_the_foreach_update_cuda_runs():
    """torch.optim's default update is the per-parameter loop on the CPU and foreach on CUDA: an estimated
    H100 rank runs on fake CPU tensors, and recorded the CPU's loop, missing foreach's list temporaries
    (measured on 2 gloo ranks with foreach=True: 16,029,616 B against the loop's 15,316,568 B for a wide
    TinyGPT whose AdamW step sets the peak).  The default now records foreach; an explicit foreach=False
    stays the loop."""
    from tests.distributed_worker import tiny_gpt

    def update_ops(optimizer):
        prof = memviz.profile(model, args, optimizer=optimizer, loss_fn=loss_of, parallel=Parallel(2),
                              device="fake:h100")
        return {c.op.split(".")[1] for c in prof.graph.computes if c.phase.value == "optimizer"}

    model, args = tiny_gpt()
    assert {"_foreach_addcdiv_", "_foreach_sqrt"} <= update_ops(torch.optim.AdamW)
    loop = update_ops(torch.optim.AdamW(model.parameters(), foreach=False))
    assert "addcdiv_" in loop and not any(op.startswith("_foreach") for op in loop)
