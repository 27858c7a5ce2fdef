"""The simulated TPU keys an eager program as torch_tpu does: shapes, dtypes and Python numbers.

torch_tpu compiles one program per eager operation and signature, and a program is keyed by its
Python scalar values too: ``t + 1`` and ``t + 2`` are two programs, and in cache-only mode the second
fails. A simulator that ignored the numbers would pass a warm-up that a chip fails.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")


def test_a_new_python_number_is_a_new_program(simulated_tpu, cache_only):
    t = torch.arange(4, device="tpu")
    before = simulated_tpu.counters()
    t + 1
    t + 1
    assert (simulated_tpu.counters() - before).eager_programs == 1
    t + 2
    assert (simulated_tpu.counters() - before).eager_programs == 2
    with cache_only("the same number again"):
        t + 1
    from transformers_tpu_ext.testing.programs import NewProgramsError as Error

    with pytest.raises(Error, match="cache-only mode"):
        with cache_only("a number not seen before"):
            t + 3
    # sizes and dims are numbers too
    t.new_zeros(2).sum(dim=0)
    before = simulated_tpu.counters()
    torch.ones(2, 3, device="tpu").sum(dim=[1])
    torch.ones(2, 3, device="tpu").sum(dim=[1])
    torch.ones(2, 3, device="tpu").sum(dim=[0])
    assert (simulated_tpu.counters() - before).eager_programs >= 2


def test_a_number_is_keyed_with_its_type_and_nan_is_one_key(simulated_tpu):
    t = torch.arange(4, device="tpu", dtype=torch.float32)
    before = simulated_tpu.counters()
    t * float("nan")
    t * float("nan")
    assert (simulated_tpu.counters() - before).eager_programs == 1
    t * 2
    t * 2.0  # another type: another program (the number promotes differently)
    assert (simulated_tpu.counters() - before).eager_programs == 3


def test_cache_only_passes_the_backend_error_through_unless_it_is_a_new_program(simulated_tpu, cache_only):
    with pytest.raises(ZeroDivisionError):
        with cache_only():
            1 / 0
