"""``data_ptr()``, ``untyped_storage()`` and the legacy ``storage()`` agree on one opaque handle, as on torch_tpu.

Before, ``tensor.storage()`` (TypedStorage, which Transformers' and users' older code still reads) gave
the simulator's empty wrapper storage: its ``data_ptr()`` raised "invalid python storage" where a chip
gives the handle ``untyped_storage().data_ptr()`` gives.
"""

from __future__ import annotations

import warnings

import pytest

torch = pytest.importorskip("torch")


def _ptrs(t):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # TypedStorage is deprecated
        typed = t.storage()
    return t.data_ptr(), t.untyped_storage().data_ptr(), typed.data_ptr(), typed.untyped().data_ptr()


def test_every_read_of_the_storage_gives_the_same_handle(simulated_tpu):
    t = torch.arange(8.0, device="tpu")
    data, untyped, typed, typed_untyped = _ptrs(t)
    assert data == untyped == typed == typed_untyped != 0
    view = t[2:]
    v_data, v_untyped, v_typed, _ = _ptrs(view)
    assert v_untyped == v_typed == untyped and v_data == untyped + 2 * t.element_size()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        storage = t.storage()
    assert storage.device.type == "tpu" and storage.size() == 8 and storage.nbytes() == 32
    assert storage.tolist() == list(range(8))  # read through torch's own path (a copy to the host)


def test_an_in_place_write_renews_every_handle_together(simulated_tpu):
    t = torch.zeros(4, device="tpu")
    before = _ptrs(t)
    t.add_(1)
    after = _ptrs(t)
    assert len(set(after)) == 1 and after[0] != before[0]
    assert _ptrs(t) == after  # stable until the next write
