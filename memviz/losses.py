"""Losses memviz can plan: the same values and gradients as PyTorch's, with less memory.

`chunked_cross_entropy` is ``F.cross_entropy`` over a large vocabulary computed a slice of rows at a
time.  PyTorch's cross-entropy keeps the log-probabilities of every row (a tensor the size of the
logits) from the forward to the backward, and its backward holds two more of that size at once (the
gradient of the log-probabilities, then the logits'); in LM training that is often the step's peak.
Here the forward keeps nothing of that size (the logits are the model's output, alive anyway), and the
backward recomputes each slice's log-probabilities, so only one slice of them exists at a time.

Pass it as the loss like any other (``memviz.profile(model, args, loss_fn=lambda out:
chunked_cross_entropy(out.logits, labels, chunks=8))``): `memviz.profiling.capture.loss_memory` measures what
it holds, so the baseline and every plan include its smaller footprint.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

__all__ = ["chunked_cross_entropy"]


def chunked_cross_entropy(logits: torch.Tensor, target: torch.Tensor, *, ignore_index: int = -100,
                          label_smoothing: float = 0.0, reduction: str = "mean",
                          chunks: int = 8) -> torch.Tensor:
    """``F.cross_entropy(logits.reshape(-1, C), target.reshape(-1), ignore_index=...,
    label_smoothing=..., reduction=...)`` computed about `chunks` slices of rows at a time.

    `logits`: ``(..., C)`` class scores in the last dimension (``(N, C)``, or ``(batch, seq, vocab)``
    from an LM head, also a non-contiguous view such as ``logits[:, :-1]``: each slice is a view, so
    nothing of the logits' size is copied); `target`: ``(...)`` class indices,
    `ignore_index` marking positions that count for nothing.  No class weights.

    The same operators as PyTorch's run on each slice (``log_softmax``, the gather of ``nll_loss``,
    the smoothing sum, ``_log_softmax_backward_data``) and the final reductions are PyTorch's own over
    the per-row values, so values and gradients equal ``F.cross_entropy``'s (bit for bit on CPU in
    the tests).  Memory: what the loss keeps for backward drops from the logits' size to a few bytes
    per row; its backward's transient from two logits-sized tensors to three slices."""
    if reduction not in ("mean", "sum", "none"):
        raise ValueError(f"reduction must be 'mean', 'sum' or 'none', not {reduction!r}")
    if logits.dim() < 2 or tuple(target.shape) != tuple(logits.shape[:-1]):
        raise ValueError(f"logits (..., C) and target (...) must agree: got {tuple(logits.shape)} and "
                         f"{tuple(target.shape)}")
    if chunks < 1:
        raise ValueError(f"chunks must be at least 1, not {chunks}")
    return _ChunkedCrossEntropy.apply(logits, target, ignore_index, float(label_smoothing), reduction,
                                      int(chunks))


Block = tuple[tuple[int, ...], int, int]


def _blocks(x: torch.Tensor, chunks: int) -> list[Block]:
    """Row slices ``x[prefix].view(-1, C)[start:end]`` covering `x`'s rows in row-major order, about
    `chunks` of them, each a view: a tensor whose rows cannot be viewed as one ``(N, C)`` matrix (the
    shifted ``logits[:, :-1]``) is split along its first dimension first."""
    classes = x.shape[-1]
    if not _rows_viewable(x):
        per = -(-chunks // x.shape[0])
        return [((i, *p), a, b) for i in range(x.shape[0]) for p, a, b in _blocks(x[i], per)]
    rows = x.numel() // classes if classes else 0
    size = max(1, -(-rows // chunks))
    return [((), a, min(a + size, rows)) for a in range(0, rows, size)]


def _rows_viewable(x: torch.Tensor) -> bool:
    """Whether ``x.view(-1, x.shape[-1])`` is a view: the leading dimensions (size-1 ones aside) step
    through memory as one index over rows of ``stride[-2]`` elements."""
    dims = [(n, st) for n, st in zip(x.shape[:-1], x.stride()[:-1], strict=True) if n != 1]
    return all(st == inner_st * inner_n for (n, st), (inner_n, inner_st) in zip(dims, dims[1:], strict=False))


def _rows(t: torch.Tensor, block: Block, classes: int | None = None) -> torch.Tensor:
    """Block `block` of `t`'s rows (``classes`` columns) or, without `classes`, of its flat entries."""
    prefix, start, end = block
    sub = t[prefix] if prefix else t
    return (sub.reshape(-1, classes) if classes is not None else sub.reshape(-1))[start:end]


class _ChunkedCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, logits: torch.Tensor, target: torch.Tensor, ignore_index: int, smoothing: float,
                reduction: str, chunks: int) -> torch.Tensor:
        classes = logits.shape[-1]
        flat_target = target.reshape(-1)
        ignored = flat_target == ignore_index
        picked = logits.new_empty(flat_target.shape[0], 1)  # each row's log-probability of its target
        smooth = logits.new_empty(flat_target.shape[0]) if smoothing else None
        start = 0
        for block in _blocks(logits, chunks):
            logp = torch.log_softmax(_rows(logits, block, classes), 1)
            t = _rows(target, block)
            end = start + t.shape[0]
            picked[start:end] = logp.gather(1, t.masked_fill(t == ignore_index, 0).unsqueeze(1))
            if smooth is not None:
                smooth[start:end] = -logp.sum(1)
            start = end
            del logp  # one slice of log-probabilities at a time
        # PyTorch's own reductions over the per-row values, in its order: the same bits as on the full
        # log-probabilities (nll_loss reads input[i][target[i]]: here column 0 of `picked`)
        column = torch.zeros_like(flat_target).masked_fill(ignored, ignore_index)
        nll = F.nll_loss(picked, column, ignore_index=ignore_index, reduction=reduction)
        ctx.save_for_backward(logits, target)
        ctx.options = (ignore_index, smoothing, reduction, chunks)
        if smooth is None:
            return nll
        smooth.masked_fill_(ignored, 0.0)
        if reduction == "mean":
            ret = smooth.sum() / (~ignored).sum()
        elif reduction == "sum":
            ret = smooth.sum()
        else:
            ret = smooth
        return (1 - smoothing) * nll + ret * (smoothing / classes)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Any:
        logits, target = ctx.saved_tensors
        ignore_index, smoothing, reduction, chunks = ctx.options
        classes = logits.shape[-1]
        ignored = target.reshape(-1) == ignore_index
        # the gradients PyTorch's graph sends into the log-probabilities, as its backward computes them
        g_nll = grad * (1 - smoothing) if smoothing else grad
        if reduction == "mean":
            valid = (~ignored).sum()
            nll_scale = -(g_nll / valid.to(grad.dtype))  # nll_loss_backward: -(grad / total_weight)
            g_smooth = (grad * (smoothing / classes)) / valid if smoothing else None
        else:
            nll_scale = -g_nll
            g_smooth = grad * (smoothing / classes) if smoothing else None
        out = torch.empty(logits.shape, dtype=logits.dtype, device=logits.device)
        start = 0
        for block in _blocks(logits, chunks):
            rows = _rows(logits, block, classes)
            logp = torch.log_softmax(rows, 1)  # recomputed: the forward kept none
            t = _rows(target, block)
            end = start + t.shape[0]
            skip = t == ignore_index
            scale = nll_scale[start:end] if reduction == "none" else nll_scale.expand(t.shape[0])
            g = torch.zeros_like(logp)
            g.scatter_(1, t.masked_fill(skip, 0).unsqueeze(1), scale.masked_fill(skip, 0).unsqueeze(1))
            if g_smooth is not None:
                s = g_smooth[start:end] if reduction == "none" else g_smooth.expand(t.shape[0])
                g.add_((-s.masked_fill(skip, 0.0)).unsqueeze(1).expand_as(g))
            _rows(out, block, classes).copy_(torch._log_softmax_backward_data(g, logp, 1, rows.dtype))
            start = end
            del logp, g
        return out, None, None, None, None, None
