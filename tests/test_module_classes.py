"""Module classes from capture to the plan file (issue 18: the Graph view names blocks by class,
"12 x GPT2Block", not by container, "12 x h"): FX's ``nn_module_stack`` gives each op's enclosing
modules with their classes; the graph keeps one class per module path."""

from __future__ import annotations

import json

import torch

import memviz
from memviz.plans.planfile import parse_document


def _tiny_gpt2() -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    from tests.real_models import transformers  # after torchvision's schema shim

    torch.manual_seed(0)
    cfg = transformers.GPT2Config(n_embd=32, n_layer=2, n_head=4, vocab_size=64, n_positions=64,
                                  use_cache=False)
    return transformers.GPT2LMHeadModel(cfg), (torch.randint(0, 64, (2, 16)),)


def test_a_captured_gpt2_block_has_its_class():
    model, args = _tiny_gpt2()
    prof = memviz.profile(model, args, mode="train", repeats=1, warmup=0, measure=False)
    prof = prof.with_costs("fake:v100")
    classes = prof.graph.meta["module_classes"]
    gpt2 = "transformers.models.gpt2.modeling_gpt2"
    assert classes["transformer.h.0"] == classes["transformer.h.1"] == f"{gpt2}.GPT2Block"
    assert classes["transformer.h.0.attn"] == f"{gpt2}.GPT2Attention"
    assert classes[""] == f"{gpt2}.GPT2LMHeadModel"
    # every op's module (backward ops included, through fwd_nn_module_stack) has a class
    assert {c.module for c in prof.graph.computes} <= set(classes)
    # and the plan file carries them
    doc = parse_document(json.dumps(memviz.plan(prof, frontier=False, packing=False).to_dict()))
    assert doc["schema"] == "memviz.plan/3" and doc["graph"]["meta"]["module_classes"] == classes
