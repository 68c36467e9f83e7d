"""What eager PyTorch holds that the eager baseline and sac plans must hold as it does (HF Swin-V2: a sac
plan measured 36.77 KiB over, the eager step 64 KiB under its baseline; `benchmarks/NOTES_unseen_hf.md`).
Each model's eager step measures at its baseline, and a sac plan's applied step at its plan.  Planned on
fixed costs (`Profile.with_costs`), so the plans do not move with the machine's load."""

from __future__ import annotations

import gc

import torch
from torch import nn

import memviz
from tests.test_apply import _fixed_cost_profile, _square_loss, check_applied, sac_plan
from tests.test_export import _Float32Scores


def _runs_as_planned(model: nn.Module, args: tuple[torch.Tensor, ...], fraction: float) -> None:
    prof = _fixed_cost_profile(model, args)
    assert prof.measured_peak_bytes == prof.baseline.peak_bytes
    verified = memviz.apply(sac_plan(prof, fraction), model, verify=True)
    assert verified.plan.solver_stats.extra["sac"]["regions"]
    assert verified.verified_peak_bytes <= verified.plan.budget_bytes
    assert check_applied(model, args, {}, _square_loss, verified.plan) == [verified.plan.peak_bytes] * 3


class PositionBias(nn.Module):
    """Swin-V2's continuous position bias: an MLP with an in-place ReLU on a fixed 4-d table (``nn.Linear``
    of a 4-d input returns a view of its 2-d result, which the ReLU overwrites)."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("table", torch.randn(1, 7, 7, 2))
        self.mlp = nn.Sequential(nn.Linear(2, 512), nn.ReLU(inplace=True), nn.Linear(512, 4, bias=False))
        self.proj = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x) + self.mlp(self.table).view(-1, 4)


def test_the_backward_of_an_in_place_op_on_a_view_copies_into_one_storage() -> None:
    """Autograd's ``CopySlices`` (the ReLU's backward on the view) copies the incoming gradient into a new
    tensor and the ReLU's gradient back into it with ``copy_``: one storage, which the functionalized
    capture names three times (`memviz.plans.sac.backward_copies`).  Main: the baseline 100352 B (one
    512-wide activation of the table) over the measured step."""
    torch.manual_seed(0)
    _runs_as_planned(nn.Sequential(PositionBias(), PositionBias()), (torch.randn(49, 4),), 0.5)


class Attention(nn.Module):
    def __init__(self, dropout: bool) -> None:
        super().__init__()
        self.fc = nn.Linear(64, 64)
        self.drop = nn.Dropout(0.1) if dropout else nn.Identity()

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor]:
        return (self.drop(self.fc(x)),)


class Layer(nn.Module):
    """A Swin-V2 layer's shape: its attention's output, and on a shifted layer the shifted input, are held
    by the layer's locals to its return (no op saves them: ``flip`` stands for Swin's window partition
    and reverse, copies), under a wide temporary no op saves either: the step's peak."""

    def __init__(self, shift: bool, dropout: bool) -> None:
        super().__init__()
        self.shift = shift
        self.attention = Attention(dropout)
        self.norm = nn.LayerNorm(64)
        self.fc = nn.Linear(64, 64)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        padded = nn.functional.pad(x, (0, 0))  # Swin's ``maybe_pad``: a copy, even of no padding
        if self.shift:
            shifted = torch.roll(padded, 1, 0)
        else:
            shifted = padded
        outputs = self.attention(shifted.flip(0))
        h = x + self.norm(outputs[0].flip(0))
        wide = h.repeat(1, 32)
        return h + self.fc(h) + (wide + 1).sum(1, keepdim=True)


def _layers(shift: bool, dropout: bool) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(Layer(shift, dropout), Layer(shift, dropout), nn.Linear(64, 64))


def test_a_statements_value_is_the_dropout_output_not_its_mask() -> None:
    """``outputs = self.attention(x)`` ends in a dropout, whose capture returns (output, mask): the mask,
    the op's last output, was taken for the statement's value, and the output, which ``outputs`` holds
    to the layer's return, was freed after its last reader (`profile._autograd_only_output`).  Main: the
    baseline 64 KiB under the measured step."""
    _runs_as_planned(_layers(False, True), (torch.randn(256, 64),), 0.5)


def test_the_branch_an_if_did_not_take_binds_nothing() -> None:
    """``if shift: shifted = roll(padded) else: shifted = padded``: the ``else`` lies between the ``roll`` and
    the next traced statement and was read as run, rebinding ``shifted`` to ``padded``: the shifted input,
    held to the layer's return, was freed after its last reader (`profile._ran_after`).  Main: the
    baseline 64 KiB under the measured step."""
    _runs_as_planned(_layers(True, False), (torch.randn(256, 64),), 0.5)


class Pair(nn.Module):
    """Two values bound by one statement to a tuple target (HF Mamba2's chunked scan binds four:
    ``hidden_states, A, B, C = [reshape_into_chunks(t, ...) for t in (hidden_states, A, B, C)]``), each
    held by its name to the return, under a wide temporary no op saves."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(64, 64)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a, b = [nn.functional.pad(t, (0, 0)) for t in (x.flip(0), x.roll(1, 0))]
        h = self.fc(a + b)
        wide = h.repeat(1, 32)
        return h + (wide + 1).sum(1, keepdim=True)


def test_a_tuple_target_binds_each_name_its_own_value() -> None:
    """``a, b = [pad(t) for t in (...)]``: both names were bound to the statement's last value, and ``a``,
    which its name holds to the return, was freed after its last reader (`profile._statement_values`).
    Main: the baseline 64 KiB under the measured step."""
    torch.manual_seed(0)
    _runs_as_planned(nn.Sequential(Pair(), Pair(), nn.Linear(64, 64)), (torch.randn(256, 64),), 0.5)


def _scan(x: torch.Tensor, fc: nn.Module) -> torch.Tensor:
    """A model's helper function (HF Mamba2's ``mamba2_chunk_scan``): its locals live to its return."""
    shifted = x.roll(1, 0)
    h = fc(shifted.flip(0))
    wide = h.repeat(1, 32)
    return h + (wide + 1).sum(1, keepdim=True)


class Scan(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(64, 64)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _scan(x, self.fc)


def test_a_helper_functions_locals_are_held_to_its_return() -> None:
    """torch.export records only ``forward`` frames: a helper function's statements were one statement of
    its caller, and ``shifted``, which the helper's local holds to its return, was freed after its last
    reader (`capture.library_frames_in_stack_traces` keeps the frames of the model's own source files).
    Main: the baseline 64 KiB under the measured step."""
    torch.manual_seed(0)
    _runs_as_planned(nn.Sequential(Scan(), Scan(), nn.Linear(64, 64)), (torch.randn(256, 64),), 0.5)


def test_a_float32_block_under_the_callers_autocast_is_held_as_eager_holds_it() -> None:
    """A module's own ``with torch.autocast(..., enabled=False):`` block (float32 attention scores) in a
    step run under the caller's bfloat16 autocast.  Which tensors the block's ``bmm`` saves was asked of
    autograd under the caller's autocast, which cast its inputs and saved the casts: the float32 inputs,
    which the node holds to its backward's end, were freed at their last reader; and the backward's own
    casts (autocast's of the formula's inputs, the engine's of its results) were held to the node's end
    (`saved.gradient_input_holds`).  Main: the baseline 512 B (2.4%) under the measured step."""
    torch.manual_seed(0)
    model = _Float32Scores()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        prof = memviz.profile(model, (torch.randn(2, 8, 32),), repeats=1, warmup=0)
    assert prof.measured_peak_bytes == prof.baseline.peak_bytes


class _Cycle:
    """An object that refers to itself: Python frees it, and what it holds, only when its cyclic garbage
    collector runs (``torch.distributions``' transforms, which HF Informer's loss builds on its outputs)."""

    def __init__(self, value: torch.Tensor) -> None:
        self.value = value
        self.me = self


class Scaled(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(64, 64)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.fc(x)
        scale = h.detach().abs() + 1
        _Cycle(scale)
        return self.fc(h.relu()).repeat(1, 8), scale  # its backward's peak: the wide gradient


def test_an_output_a_reference_cycle_holds_is_held_to_the_steps_end() -> None:
    """The model's second output, which the loss does not read, is held by a reference cycle until the
    garbage collector runs (here: not in the step): the graph freed it once the loss had read the
    outputs (`capture.kept_across_calls`).  Main: the baseline 64 KiB under the measured step (HF
    Informer: 16 B, `apply(verify=True)` 12 B over the plan of the model's own step)."""
    torch.manual_seed(0)
    gc.collect()
    gc.disable()  # a collection inside the measured step would free the cycle at a point none can tell
    try:
        prof = memviz.profile(Scaled(), (torch.randn(256, 64),), loss_fn=lambda out: out[0].square().sum(),
                              repeats=1, warmup=0)
    finally:
        gc.enable()
    assert prof.measured_peak_bytes == prof.baseline.peak_bytes
