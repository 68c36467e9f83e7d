"""The capture's reads of tensor values taken from eager's run (`capture._eager_scalar`): per line of the
model's code, in call order."""

from __future__ import annotations

from typing import Any

import torch

from memviz.profiling.capture import EagerReads, _eager_scalar, _user_code_line


def _reader(values: list[Any]) -> Any:
    """A read through `_eager_scalar` whose eager values are `values`, all made at one line of code."""
    eager = EagerReads(values={})
    impl = _eager_scalar(lambda *a: None, eager, [])

    def read(op: Any, t: torch.Tensor) -> tuple[Any, str]:
        return impl(None, op, t), _user_code_line()  # one line: the read and the key eager's reads have

    _, line = read(torch.ops.aten._local_scalar_dense.default, torch.zeros(()))  # no values yet: the kernel's
    eager.values[line] = values
    return lambda op, t: read(op, t)[0]


def test_a_read_tensor_freed_at_once_does_not_hand_its_value_to_the_next():
    # Autoformer reads ``int(top_k_delays_index[i])`` in a loop: each indexed tensor is freed once read,
    # and the next one may get its id; keyed by id alone, it got the stale value, the loop made one read
    # fewer than eager, and every later read (a distribution's argument check) was one off
    read = _reader([3, 5, 7, 11])
    seen = []
    for _ in range(4):
        t = torch.zeros(())
        seen.append(read(torch.ops.aten._local_scalar_dense.default, t))
        del t
    assert seen == [3, 5, 7, 11]


def test_item_then_its_dense_read_of_one_tensor_is_one_read():
    read = _reader([3, 5])
    t, u = torch.zeros(()), torch.zeros(())
    aten = torch.ops.aten
    assert [read(aten.item.default, t), read(aten._local_scalar_dense.default, t),
            read(aten.item.default, u)] == [3, 3, 5]
