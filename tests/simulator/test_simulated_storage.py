"""The simulated TPU's device memory and process group, as torch_tpu shows them (issue 19, item 12).

A torch_tpu tensor has a real storage on ``tpu`` whose data pointer is an opaque handle (a
``DeviceBufferRef*``), not host memory, and the handle changes after every in-place write; torch_tpu
has no serialization hooks of its own, so ``torch.save`` takes torch's storage path
(``storage.cpu()``) and ``torch.load`` of a ``tpu:0`` location rebuilds the tensor on the chip
(``shared/reference/torch_tpu-0.2.0-internals.md`` Q1). ProcessGroupTpu has no ``reduce``,
``allreduce_coalesced`` or ``allgather_coalesced`` (Q7). A simulator kinder than the chip would hide
code that reads device memory through a pointer, keys caches on ``data_ptr()`` across steps, or
calls a collective the chip lacks.

The plugin's patches are switched off: these tests check the stand-in for torch_tpu.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch


pytestmark = pytest.mark.usefixtures("plugin_patches_off")  # tests/simulator/conftest.py


# -- storage and data pointers -------------------------------------------------------------------


def test_user_code_sees_a_device_storage_with_an_opaque_handle(simulated_tpu):
    a = torch.arange(6.0, device="tpu")
    view, tied = a[2:], a
    storage = a.untyped_storage()
    assert storage.device.type == "tpu" and storage.nbytes() == 24
    # an id at one moment: shared by every tensor on that memory, views offset from it
    assert tied.data_ptr() == a.data_ptr() == storage.data_ptr() != 0
    assert view.data_ptr() == a.data_ptr() + 2 * a.element_size()
    assert view.untyped_storage().data_ptr() == storage.data_ptr()
    assert a.data_ptr() != torch.arange(6.0, device="tpu").data_ptr()
    # torch's own path reads it
    assert torch.frombuffer(bytearray(bytes(storage.cpu())), dtype=torch.float32).tolist() == [0, 1, 2, 3, 4, 5]
    with pytest.raises(TypeError):
        a.numpy()


def test_the_handle_changes_after_every_in_place_write_and_only_then(simulated_tpu):
    a = torch.zeros(4, device="tpu")
    view = a[1:]
    first = a.data_ptr()
    assert a.data_ptr() == first and (a + 1).sum().item() == 4  # reads leave it alone
    view.add_(1)  # a write through a view renews the handle of the whole storage
    second = a.data_ptr()
    assert second != first and view.data_ptr() == second + a.element_size()
    a.copy_(torch.ones(4))  # a host-to-device copy is a write too
    assert a.data_ptr() not in (first, second)
    param = torch.nn.Parameter(torch.ones(3, device="tpu"))
    optimizer = torch.optim.SGD([param], lr=0.1)
    before = param.data_ptr()
    param.sum().backward()
    optimizer.step()
    assert param.data_ptr() != before  # a training step moves every trained parameter's handle


def test_code_outside_torch_cannot_read_device_memory_through_the_pointer(simulated_tpu):
    """ctypes at ``data_ptr()`` must not find the tensor's values: on a chip there is no tensor data at
    that address (the subprocess may crash: that is what reading a handle does)."""
    code = textwrap.dedent(
        """
        import ctypes, torch
        from transformers_tpu_ext import testing
        testing.install()
        t = torch.arange(1000, 1004, dtype=torch.int32, device="tpu")
        print("READ", list(ctypes.string_at(t.data_ptr(), 16)), flush=True)
        """
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRANSFORMERS_TPU_EXT_")}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=240, env=env)
    data = list(torch.arange(1000, 1004, dtype=torch.int32).numpy().tobytes())
    assert f"READ {data}" not in proc.stdout, "ctypes read the tensor's values through its data pointer"


# -- torch.save / torch.load ------------------------------------------------------------------------


def test_torch_save_writes_device_storages_and_load_honours_map_location(simulated_tpu, tmp_path):
    base = torch.arange(8.0, device="tpu")
    path = tmp_path / "state.pt"
    torch.save({"base": base, "tail": base[4:], "step": torch.tensor(3, device="tpu")}, path)
    locations: list[str] = []
    torch.load(path, weights_only=True, map_location=lambda storage, location: locations.append(location) or storage)
    assert locations and set(locations) == {"tpu:0"}  # written as the chip writes: storages on tpu:0
    loaded = torch.load(path, weights_only=True)
    assert loaded["base"].device.type == loaded["tail"].device.type == "tpu"
    assert loaded["step"].device.type == "tpu" and loaded["step"].item() == 3
    loaded["base"][4:].add_(100)  # the view still shares the base's memory
    assert loaded["tail"].cpu().tolist() == [104.0, 105.0, 106.0, 107.0]
    on_host = torch.load(path, weights_only=True, map_location="cpu")
    assert on_host["base"].device.type == "cpu" and on_host["base"].tolist() == list(map(float, range(8)))
    # a file saved on the host, loaded onto the chip
    torch.save({"w": torch.ones(2)}, tmp_path / "host.pt")
    moved = torch.load(tmp_path / "host.pt", weights_only=True, map_location="tpu")["w"]
    assert moved.device.type == "tpu" and moved.cpu().tolist() == [1.0, 1.0]


def test_torch_save_of_low_precision_and_parameters(simulated_tpu, tmp_path):
    state = {
        "bf16": torch.arange(4, dtype=torch.bfloat16, device="tpu"),
        "param": torch.nn.Parameter(torch.ones(2, 2, device="tpu")),
        "int": torch.arange(3, device="tpu"),
    }
    torch.save(state, tmp_path / "s.pt")
    loaded = torch.load(tmp_path / "s.pt", weights_only=True)
    for key, value in state.items():
        assert loaded[key].device.type == "tpu" and loaded[key].dtype == value.dtype
        assert torch.equal(loaded[key].cpu(), value.detach().cpu())
    assert loaded["param"].requires_grad


# -- the collectives ProcessGroupTpu lacks -----------------------------------------------------------


@pytest.fixture
def tpu_group(simulated_tpu, tmp_path):
    import torch.distributed as dist

    dist.init_process_group("tpu_dist", init_method=f"file://{tmp_path}/store", rank=0, world_size=1)
    try:
        yield dist
    finally:
        dist.destroy_process_group()


def test_the_tpu_process_group_refuses_what_torch_tpu_lacks(tpu_group):
    dist = tpu_group
    x = torch.arange(4.0, device="tpu")
    with pytest.raises(RuntimeError, match="does not support reduce"):
        dist.reduce(x, dst=0)
    with pytest.raises(RuntimeError, match="does not support allreduce_coalesced"):
        dist.all_reduce_coalesced([x, x.clone()])
    with pytest.raises(RuntimeError, match="does not support allgather_coalesced"):
        dist.all_gather_coalesced([[torch.empty(4, device="tpu")]], [x])


def test_the_tpu_process_group_keeps_what_torch_tpu_has(tpu_group):
    dist = tpu_group
    x = torch.arange(4.0, device="tpu").reshape(2, 2)
    dist.all_reduce(x)
    dist.broadcast(x, src=0)
    out = torch.empty(2, 2, device="tpu")
    dist.all_gather_into_tensor(out, x)  # world x input on dim 0
    shard = torch.empty(2, 2, device="tpu")
    dist.reduce_scatter_tensor(shard, x)
    gathered = [torch.empty(2, 2, device="tpu")]
    dist.all_gather(gathered, x)
    assert out.cpu().tolist() == shard.cpu().tolist() == gathered[0].cpu().tolist() == [[0.0, 1.0], [2.0, 3.0]]
