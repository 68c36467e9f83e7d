"""The capture's reads of tensor values taken from eager's run (`capture._eager_scalar`), in call order."""

from __future__ import annotations

import torch

from memviz.profiling.capture import EagerReads, _eager_scalar


def test_a_read_tensor_freed_at_once_does_not_hand_its_value_to_the_next():
    # Autoformer reads ``int(top_k_delays_index[i])`` in a loop: each indexed tensor is freed once read,
    # and the next one may get its id; keyed by id alone, it got the stale value, the loop made one read
    # fewer than eager, and every later read (a distribution's argument check) was one off
    impl = _eager_scalar(lambda *a: None, EagerReads(values=[3, 5, 7, 11]), [])
    seen = []
    for _ in range(4):
        t = torch.zeros(())
        seen.append(impl(None, torch.ops.aten._local_scalar_dense.default, t))
        del t
    assert seen == [3, 5, 7, 11]


def test_item_then_its_dense_read_of_one_tensor_is_one_read():
    impl = _eager_scalar(lambda *a: None, EagerReads(values=[3, 5]), [])
    t, u = torch.zeros(()), torch.zeros(())
    aten = torch.ops.aten
    assert [impl(None, aten.item.default, t), impl(None, aten._local_scalar_dense.default, t),
            impl(None, aten.item.default, u)] == [3, 3, 5]
