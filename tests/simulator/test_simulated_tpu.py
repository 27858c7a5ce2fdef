"""The simulated TPU (capability 6): device, torch.tpu surface and quirks, compile backend, counters.

Every test uses the ``simulated_tpu`` fixture of the package's own pytest plugin. The plugin's
patches are switched off for this module: these tests check the stand-in for torch_tpu, i.e.
what plain PyTorch/Transformers code sees on it.
"""

from __future__ import annotations

import os

import pytest
import torch

from _subprocess import run_python

from transformers_tpu_ext.testing import Counters
from transformers_tpu_ext.testing import chips
from transformers_tpu_ext.testing.host import memory_bytes as host_memory_bytes


pytestmark = pytest.mark.usefixtures("plugin_patches_off")  # tests/simulator/conftest.py


@pytest.fixture
def sim(simulated_tpu):
    return simulated_tpu


# --- the device -------------------------------------------------------------------------------


def test_accelerator_reports_the_configured_chips(sim):
    assert torch.accelerator.current_accelerator().type == "tpu"
    assert torch.accelerator.is_available()
    assert torch.accelerator.device_count() == 4
    sim.configure(chips=8)
    assert torch.accelerator.device_count() == 8
    assert torch._C._get_privateuse1_backend_name() == "tpu"


def test_install_is_idempotent_and_a_second_call_reconfigures(sim):
    from transformers_tpu_ext import testing

    again = testing.install(chips=1, generation="v5e")
    assert again is sim and testing.simulated_tpu() is sim and testing.is_installed()
    assert torch.accelerator.device_count() == 1
    assert torch.tpu.get_device_name() == "TPU v5e"


@pytest.mark.parametrize(
    "make",
    [
        lambda d: torch.zeros(2, 3, device=d),
        lambda d: torch.ones(4, device=d, dtype=torch.bfloat16),
        lambda d: torch.arange(5, device=d),
        lambda d: torch.full((2,), 7.0, device=d),
        lambda d: torch.tensor([[1, 2], [3, 4]], device=d),
        lambda d: torch.tensor(3.5, device=d),
        lambda d: torch.eye(3, device=d),
        lambda d: torch.linspace(0, 1, 5, device=d),
    ],
    ids=["zeros", "ones_bf16", "arange", "full", "tensor", "tensor_scalar", "eye", "linspace"],
)
def test_factories_make_tpu_tensors_with_cpu_values(sim, make):
    on_tpu, on_cpu = make("tpu"), make("cpu")
    assert on_tpu.device == torch.device("tpu", 0)
    assert on_tpu.dtype == on_cpu.dtype and on_tpu.shape == on_cpu.shape
    assert torch.equal(on_tpu.cpu(), on_cpu)


def test_empty_and_random_factories(sim):
    assert torch.empty(3, 2, device="tpu").shape == (3, 2)
    torch.manual_seed(0)
    a = torch.randn(5, device="tpu")
    torch.manual_seed(0)  # torch.manual_seed seeds the TPU generator too
    b = torch.randn(5, device="tpu")
    torch.tpu.manual_seed(1)
    c = torch.randn(5, device="tpu")
    assert a.device.type == "tpu" and torch.equal(a.cpu(), b.cpu()) and not torch.equal(a.cpu(), c.cpu())
    assert torch.rand(3, device="tpu").cpu().lt(1).all()


def test_to_and_cpu_round_trip_and_count_host_device_bytes(sim):
    host = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    dev = host.to("tpu")
    assert dev.device.type == "tpu" and dev.is_tpu and not host.is_tpu
    assert sim.counters().h2d_bytes == 48
    back = dev.cpu()
    assert back.device.type == "cpu" and torch.equal(back, host)
    assert dev.tolist() == host.tolist()
    assert dev.sum().item() == 66.0
    assert sim.counters().d2h_bytes == 48 + 48 + 4
    assert dev.to("tpu") is dev  # already there: no copy
    assert dev.to(torch.float16).device.type == "tpu"
    with pytest.raises(TypeError, match="Use Tensor.cpu"):
        dev.numpy()


def test_tensor_to_int_ignores_the_index(sim):
    """torch_tpu #4164: one process sees one chip, as tpu:0, whatever the index."""
    assert torch.ones(2).to(1).device == torch.device("tpu", 0)
    assert torch.ones(2, device="tpu:3").device == torch.device("tpu", 0)
    assert torch.ones(2, device="tpu").to("tpu:2").device == torch.device("tpu", 0)


def test_in_place_ops_and_views_share_data(sim):
    x = torch.arange(6.0, device="tpu").view(2, 3)
    row = x[0]
    assert row.device.type == "tpu"
    returned = row.add_(10)
    assert returned is row
    assert x.cpu().tolist() == [[10.0, 11.0, 12.0], [3.0, 4.0, 5.0]]
    x.T[2].fill_(-1)
    assert x.cpu()[:, 2].tolist() == [-1.0, -1.0]
    x.copy_(torch.zeros(2, 3))  # host -> device copy into an existing tensor
    assert x.cpu().abs().sum().item() == 0.0
    assert not x.T.is_contiguous() and x.T.shape == (3, 2)


def test_metadata_mutating_in_place_ops_restride_the_tpu_tensor(sim):
    x = torch.arange(6.0, device="tpu").view(2, 3).clone()
    assert x.t_() is x and x.shape == (3, 2) and x.stride() == (1, 3)
    assert x.contiguous().cpu().tolist() == [[0.0, 3.0], [1.0, 4.0], [2.0, 5.0]]
    assert x.unsqueeze_(0).shape == (1, 3, 2) and (x + 1).shape == (1, 3, 2)
    with pytest.raises(RuntimeError, match="allocate the output with its final shape"):
        torch.add(x, x, out=torch.empty(0, device="tpu"))  # growth cannot be simulated


def test_deepcopy_save_pretrained_and_from_pretrained_on_tpu(sim, tmp_path):
    import copy

    from transformers import AutoModelForCausalLM

    from transformers_tpu_ext.testing.tiny import tiny_model

    model = tiny_model("qwen3", vocab_size=100).to("tpu")
    clone = copy.deepcopy(model)
    assert clone.lm_head.weight.device.type == "tpu"
    assert torch.equal(clone.lm_head.weight.cpu(), model.lm_head.weight.cpu())
    model.save_pretrained(tmp_path)  # tied embeddings: shared storage is recognised
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path, device_map="tpu")
    assert loaded.device.type == "tpu"
    assert torch.equal(loaded.model.embed_tokens.weight.cpu(), model.model.embed_tokens.weight.cpu())


def test_out_variants_return_the_given_tensor(sim):
    a = torch.ones(3, device="tpu")
    out = torch.empty(3, device="tpu")
    assert torch.add(a, a, out=out) is out
    assert out.cpu().tolist() == [2.0, 2.0, 2.0]
    values, indices = torch.topk(torch.tensor([3.0, 1.0, 2.0], device="tpu"), 2)
    assert values.device.type == "tpu" and indices.cpu().tolist() == [0, 2]


def test_mixing_a_host_tensor_into_a_tpu_op_fails_like_the_real_device(sim):
    x = torch.ones(3, device="tpu")
    with pytest.raises(RuntimeError, match="tensor is expected to be on tpu, got cpu"):
        x + torch.ones(3)
    with pytest.raises(RuntimeError, match="tensor is expected to be on tpu, got cpu"):
        torch.nn.Linear(3, 3)(x)
    assert (x + torch.tensor(1.0)).cpu().tolist() == [2.0, 2.0, 2.0]  # 0-dim host scalars are fine


def test_autograd_runs_on_tpu(sim):
    w = torch.randn(3, device="tpu", requires_grad=True)
    (w * w).sum().backward()
    assert w.grad.device.type == "tpu"
    assert torch.allclose(w.grad.cpu(), 2 * w.detach().cpu())


def test_module_to_tpu_moves_parameters_and_keeps_ties_by_default(sim):
    class Tied(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a = torch.nn.Linear(3, 3, bias=False)
            self.b = torch.nn.Linear(3, 3, bias=False)
            self.b.weight = self.a.weight

    model = Tied().to("tpu")
    assert model.a.weight.device.type == "tpu" and isinstance(model.a.weight, torch.nn.Parameter)
    assert model.a.weight is model.b.weight
    out = model.b(model.a(torch.ones(1, 3, device="tpu")))
    assert out.device.type == "tpu"

    sim.configure(untie_on_move=True)  # torch_tpu #4161: Module._apply, behind every move
    on_tpu = (Tied().to("tpu"), Tied().tpu(), Tied().to(device="tpu", dtype=torch.float32))
    back = model.cpu()  # moved to the TPU tied (quirk off), now off it: untied too
    for moved in on_tpu + (Tied().to_empty(device="tpu"), back):
        assert moved.a.weight is not moved.b.weight
        assert moved.a.weight.device == moved.b.weight.device
        assert isinstance(moved.b.weight, torch.nn.Parameter)
    for moved in on_tpu:  # two copies of one matrix: an update of one no longer reaches the other
        assert torch.equal(moved.a.weight.cpu(), moved.b.weight.cpu())
        with torch.no_grad():
            moved.a.weight.zero_()
        assert moved.b.weight.abs().sum().item() > 0
    stays = Tied().to(torch.float64)  # no move to or from the TPU: ties kept
    assert stays.a.weight is stays.b.weight


def test_a_tpu_parameter_class_rebuilds_parameters_like_accelerate_expects(sim):
    from accelerate.utils import set_module_tensor_to_device

    layer = torch.nn.Linear(2, 2).to("tpu")
    param_cls = type(layer.weight)  # a TpuTensor that passes isinstance(..., Parameter)
    rebuilt = param_cls(torch.ones(2, 2), requires_grad=False)
    assert isinstance(rebuilt, torch.nn.Parameter) and rebuilt.device.type == "cpu"
    set_module_tensor_to_device(layer, "weight", "cpu")
    assert layer.weight.device.type == "cpu" and isinstance(layer.weight, torch.nn.Parameter)
    set_module_tensor_to_device(layer, "bias", "tpu", value=torch.zeros(2))
    assert layer.bias.device.type == "tpu" and isinstance(layer.bias, torch.nn.Parameter)
    assert layer.bias.cpu().tolist() == [0.0, 0.0]


def test_moving_to_meta_gives_meta_like_a_real_device(sim):
    # Accelerate's offload hooks park a weight with set_module_tensor_to_device(..., "meta") after
    # each forward; the parameter must land on meta (a Parameter, no copy), not on the host.
    from accelerate.utils import set_module_tensor_to_device

    x = torch.ones(2, 3, device="tpu")
    start = sim.counters()
    assert x.to("meta").device.type == "meta"
    assert torch.empty_like(x, device="meta").device.type == "meta"
    assert x.new_empty(4, device="meta").device.type == "meta"
    assert (sim.counters() - start).d2h_bytes == 0
    layer = torch.nn.Linear(2, 2).to("tpu")
    set_module_tensor_to_device(layer, "weight", "meta")
    assert layer.weight.device.type == "meta" and type(layer.weight) is torch.nn.Parameter
    set_module_tensor_to_device(layer, "weight", "tpu", value=torch.ones(2, 2))
    assert layer.weight.device.type == "tpu" and isinstance(layer.weight, torch.nn.Parameter)


def test_distinct_tpu_tensors_have_distinct_nonzero_data_ptrs(sim):
    # Accelerate keys tied weights by data_ptr(); a real device never reports 0 for live memory.
    a, b = torch.zeros(4, device="tpu"), torch.zeros(4, device="tpu")
    assert a.data_ptr() != 0 and b.data_ptr() != 0 and a.data_ptr() != b.data_ptr()
    assert a[1:].data_ptr() == a.data_ptr() + a.element_size()


def test_tpu_dist_process_group_reduces_tpu_tensors_in_place(sim, tmp_path):
    # Transformers picks "tpu_dist" for the tpu device (DISTRIBUTED_BACKEND_MAP); here a one-rank group.
    import torch.distributed as dist

    assert {"tpu_dist", "tpu"} <= set(dist.Backend.backend_list)
    dist.init_process_group("tpu_dist", init_method=f"file://{tmp_path}/store", rank=0, world_size=1)
    try:
        assert dist.get_backend() == "tpu_dist"
        x = torch.arange(4.0, device="tpu")
        dist.all_reduce(x)
        assert x.device.type == "tpu" and x.cpu().tolist() == [0.0, 1.0, 2.0, 3.0]
        gathered = [torch.empty(4, device="tpu")]
        dist.all_gather(gathered, x)
        assert gathered[0].device.type == "tpu" and gathered[0].cpu().tolist() == [0.0, 1.0, 2.0, 3.0]
    finally:
        dist.destroy_process_group()


# --- counters -----------------------------------------------------------------------------------


def test_eager_programs_count_distinct_op_shape_signatures(sim):
    x = torch.ones(4, 4, device="tpu")
    start = sim.counters()
    x + x
    x + x  # same (op, shapes, dtypes): no new program
    assert (sim.counters() - start).eager_programs == 1
    x[:2] + x[:2]  # new shape: a new program; the slice (a view) compiles nothing
    assert (sim.counters() - start).eager_programs == 2
    x.double() + x.double()  # new dtype: _to_copy is free, add compiles once more
    assert (sim.counters() - start).eager_programs == 3
    x.view(16).t()  # views only
    assert (sim.counters() - start).eager_programs == 3
    sim.reset_counters()
    assert sim.counters() == Counters()
    x + x
    assert sim.counters().eager_programs == 1  # reset also forgets the programs seen


def test_eager_ops_count_every_run_and_graph_calls_every_compiled_run(sim):
    import torch

    x = torch.ones(3, device="tpu")
    before = sim.counters()
    for _ in range(3):
        x + x
    delta = sim.counters() - before
    assert (delta.eager_programs, delta.eager_ops, delta.graph_calls) == (1, 3, 0)
    compiled = torch.compile(lambda t: (t * 2 + 1).sum(), backend="tpu", dynamic=False)
    before = sim.counters()
    for _ in range(3):
        compiled(x)
    delta = sim.counters() - before
    assert (delta.graphs_compiled, delta.graph_calls, delta.eager_ops) == (1, 3, 0)


def test_counters_are_frozen_snapshots_with_delta_and_asdict():
    a = Counters(graphs_compiled=2, eager_programs=10, h2d_bytes=100, d2h_bytes=4)
    b = Counters(graphs_compiled=1, eager_programs=3, h2d_bytes=40, d2h_bytes=4)
    assert a - b == Counters(1, 7, 60, 0)
    assert (a - b).asdict() == {"graphs_compiled": 1, "eager_programs": 7, "h2d_bytes": 60, "d2h_bytes": 0, "programs_loaded": 0,
                                "graph_calls": 0, "eager_ops": 0}
    assert a.programs == 12
    with pytest.raises(Exception):
        a.graphs_compiled = 3  # type: ignore[misc]


# --- torch.tpu surface and quirks ----------------------------------------------------------------


@pytest.mark.parametrize("name", ["device_count", "is_available"])
def test_torch_tpu_device_count_and_is_available_raise_for_user_code(sim, name):
    with pytest.raises(RuntimeError, match=f"is internal to TorchTPU.*Use torch.accelerator.{name} instead"):
        getattr(torch.tpu, name)()
    # PyTorch itself may still call them (torch.accelerator delegates to them).
    assert torch.accelerator.device_count() == 4
    # (every internal name, and the torch release it is internal from: tests/simulator/test_internal_apis.py)


def test_set_device_accepts_only_the_bound_index(sim, request):
    with pytest.raises(RuntimeError, match="set_device is internal to TorchTPU"):  # torch >= 2.11
        torch.tpu.set_device(0)
    request.getfixturevalue("legacy_device_apis")  # TORCH_TPU_ALLOW_LEGACY_DEVICE_APIS=1
    with pytest.warns(UserWarning, match="set_device is internal"):
        torch.tpu.set_device(0)
    torch.tpu.set_device("tpu:0")
    with pytest.raises(ValueError, match="Cannot set TPU device to index 1, current process is bound to device index 0"):
        torch.tpu.set_device(1)
    assert torch.accelerator.current_device_index() == 0


@pytest.mark.parametrize(
    "generation, hbm_gib, cores",
    [("v4", 32, 2), ("v5e", 16, 1), ("v5p", 95, 2), ("v6e", 32, 1), ("v7", 192, 2)],
)
def test_device_properties_per_generation(sim, generation, hbm_gib, cores):
    sim.configure(generation=generation, hbm_bytes=f"{hbm_gib}GiB")
    props = torch.tpu.get_device_properties()
    assert props.name == f"TPU {generation}" == torch.tpu.get_device_name()
    assert props.total_memory == hbm_gib * 2**30 == chips.CHIPS[generation].hbm_bytes
    assert props.multi_processor_count == cores
    with pytest.raises(Exception):
        props.total_memory = 1  # frozen dataclass


def test_default_hbm_fits_the_host_it_runs_on(sim):
    # Everything on the simulated TPU lives in host memory: the serving KV cache, sized from the HBM, once
    # allocated 30.9 GB on a 24 GiB machine (a v6e's 32 GiB). By default the host's chips share half of it.
    host = host_memory_bytes()
    for generation, count in (("v6e", 4), ("v5p", 8), ("v7", 2), ("v5e", 1)):
        sim.configure(generation=generation, chips=count)
        total = torch.tpu.get_device_properties().total_memory
        assert total * count <= host // 2 and total <= chips.CHIPS[generation].hbm_bytes
    sim.configure(hbm_bytes="40GiB")  # asked for: the user's call
    assert torch.tpu.get_device_properties().total_memory == 40 * 2**30


def test_default_hbm_rule():
    v6e = chips.CHIPS["v6e"]
    GiB = 2**30
    assert chips.default_hbm(v6e, 4, 512 * GiB) == 32 * GiB  # a big host: the chip's own
    assert chips.default_hbm(v6e, 4, 24 * GiB) == 3 * GiB  # 24 GiB / 2 / 4
    assert chips.default_hbm(v6e, 4, int(23.5 * GiB)) == int(2.75 * GiB)  # in steps of 256 MiB
    assert chips.default_hbm(v6e, 8, GiB) == 256 * 2**20  # never below one step
    assert chips.default_hbm(v6e, 4, None) == 32 * GiB  # host memory unknown


def test_hbm_override_and_unknown_generation(sim):
    sim.configure(hbm_bytes="1GiB")
    assert torch.tpu.get_device_properties("tpu:0").total_memory == 2**30
    sim.configure(generation="v99")
    with pytest.raises(RuntimeError, match="v99"):
        torch.tpu.get_device_properties()


def test_public_surface_of_torch_tpu_0_2_0(sim):
    names = """EagerMode Event Precision Stream allow_excess_precision compiler current_device
    current_stream default_generators default_stream device device_count device_of distributed
    eager_mode get_amp_supported_dtype get_device_name get_device_properties get_rng_state
    initial_seed is_available is_initialized manual_seed manual_seed_all ops optimizers pallas
    precision profiler set_device set_eager_mode set_rng_state set_stream stream synchronize
    topology_aware_mesh""".split()
    assert [n for n in names if not hasattr(torch.tpu, n)] == []
    import torch.tpu.distributed as dist_mod

    for n in ("set_tpu_launch_env", "spmd_safe", "topology_aware_mesh", "window_num_stripes", "window_stripe_chunk_mb"):
        assert hasattr(dist_mod, n)
    torch.accelerator.synchronize()  # torch.tpu.synchronize and get_rng_state are internal (torch >= 2.11, 2.13)
    state = torch.tpu.default_generators[0].get_state()
    first = torch.rand(2, device="tpu").cpu()
    torch.tpu.set_rng_state(state)  # experimental, not internal
    assert torch.equal(torch.rand(2, device="tpu").cpu(), first)


def test_hidden_reports_no_tpu(sim):
    from transformers_tpu_ext import backend

    assert backend.tpu_available() and backend.device_count() == 4
    with sim.hidden():
        assert not torch.accelerator.is_available()
        assert torch.accelerator.device_count() == 0
        assert torch.accelerator.current_accelerator(check_available=True) is None
        assert not backend.tpu_available() and backend.chip_info() is None
    assert torch.accelerator.is_available() and backend.chip_info().total_memory == sim.hbm()


# --- set_tpu_launch_env ------------------------------------------------------------------------

_LAUNCH_VARS = ("TORCH_TPU_SLICEBUILDER_ADDRESSES", "TORCH_TPU_TOPOLOGY", "TORCH_TPU_XPROF_SESSION_ID")


@pytest.fixture
def clean_launch_env(monkeypatch):
    # set_tpu_launch_env writes os.environ itself, which monkeypatch does not undo: the whole environment is
    # put back afterwards, or MASTER_ADDR=w-0, NODE_RANK=1... reach every later test of this process (and the
    # processes it starts: a docs page's two-host launch then waits for host w-0 until it times out).
    saved = dict(os.environ)
    multi_host = ("TORCH_TPU_DEVICES_PER_HOST", "NODE_RANK", "JOB_COMPLETION_INDEX", "NNODES", "MASTER_ADDR", "MASTER_PORT")
    for var in _LAUNCH_VARS + multi_host:
        monkeypatch.delenv(var, raising=False)
    yield monkeypatch
    os.environ.clear()
    os.environ.update(saved)


def test_set_tpu_launch_env_sets_variables_once_and_records_calls(sim, clean_launch_env):
    calls_before = len(sim.launch_env_calls)
    clean_launch_env.setenv("TORCH_TPU_TOPOLOGY", "mine")
    torch.tpu.distributed.set_tpu_launch_env()
    assert all(os.environ.get(v) for v in _LAUNCH_VARS)
    assert os.environ["TORCH_TPU_TOPOLOGY"] == "mine"  # never overwritten
    first = {v: os.environ[v] for v in _LAUNCH_VARS}
    torch.tpu.distributed.set_tpu_launch_env(nproc_per_node=4)
    assert {v: os.environ[v] for v in _LAUNCH_VARS} == first  # idempotent
    assert sim.launch_env_calls[calls_before:] == [
        {"nnodes": None, "nproc_per_node": None},
        {"nnodes": None, "nproc_per_node": 4},
    ]
    with pytest.raises(TypeError):
        torch.tpu.distributed.set_tpu_launch_env(4)  # keyword-only


@pytest.mark.parametrize(
    "generation, good, bad",
    [("v4", [1, 2, 4, 8], [3, 16]), ("v5p", [1, 2, 4, 8], [6]), ("v5e", [1, 4, 8], [2, 3]),
     ("v6e", [1, 4, 8], [2]), ("v7", [2, 4, 8], [1, 3])],
)
def test_set_tpu_launch_env_topologies(sim, clean_launch_env, generation, good, bad):
    sim.configure(generation=generation)
    for count in good:
        torch.tpu.distributed.set_tpu_launch_env(nproc_per_node=count)
    for count in bad:
        with pytest.raises(RuntimeError, match=f"^No TPU topology found for count: {count}$"):
            torch.tpu.distributed.set_tpu_launch_env(nproc_per_node=count)


def test_set_tpu_launch_env_defaults_to_the_chip_count(sim, clean_launch_env):
    sim.configure(chips=2, generation="v6e")
    with pytest.raises(RuntimeError, match="No TPU topology found for count: 2"):
        torch.tpu.distributed.set_tpu_launch_env()
    sim.configure(chips=8)
    torch.tpu.distributed.set_tpu_launch_env()
    assert os.environ["TORCH_TPU_TOPOLOGY"] == "2x4"


def test_set_tpu_launch_env_on_several_hosts_needs_the_host_index(sim, clean_launch_env):
    """A chip derives its host's index from its coordinates; the simulated one has none: without
    NODE_RANK (or JOB_COMPLETION_INDEX) it refuses instead of making every host node 0."""
    sim.configure(generation="v5p")
    clean_launch_env.setenv("TPU_WORKER_HOSTNAMES", "w-0,w-1")
    with pytest.raises(RuntimeError, match="set NODE_RANK"):
        torch.tpu.distributed.set_tpu_launch_env(nnodes=2, nproc_per_node=4)
    with pytest.raises(RuntimeError, match="list 3 hosts, got 2"):
        torch.tpu.distributed.set_tpu_launch_env(nnodes=3, nproc_per_node=4)
    clean_launch_env.setenv("JOB_COMPLETION_INDEX", "1")
    torch.tpu.distributed.set_tpu_launch_env(nnodes=2, nproc_per_node=4)
    assert {k: os.environ[k] for k in ("NODE_RANK", "NNODES", "MASTER_ADDR", "MASTER_PORT", "TORCH_TPU_DEVICES_PER_HOST")} == {
        "NODE_RANK": "1", "NNODES": "2", "MASTER_ADDR": "w-0", "MASTER_PORT": "29500", "TORCH_TPU_DEVICES_PER_HOST": "4",
    }
    assert os.environ["TORCH_TPU_SLICEBUILDER_ADDRESSES"] == "w-0:8471,w-1:8471"


# --- torch.compile -------------------------------------------------------------------------------


def _fn(x, y):
    z = torch.zeros(x.shape, device="tpu")  # a tensor created on tpu while tracing
    z.add_(x)
    w = torch.ones(3, device=x.device) * 2
    return (z * y).sum() + w.sum()


def test_compile_backend_tpu_counts_one_graph_and_no_eager_programs(sim):
    x, y = torch.randn(3, device="tpu"), torch.randn(3, device="tpu")
    expected = _fn(x, y).cpu()
    sim.reset_counters()
    compiled = torch.compile(_fn, backend="tpu")
    out = compiled(x, y)
    assert out.device.type == "tpu" and torch.allclose(out.cpu(), expected)
    compiled(x, y)
    compiled(x + 1, y)  # `x + 1` is one eager program
    assert sim.counters().graphs_compiled == 1
    assert sim.counters().eager_programs == 1
    compiled(torch.randn(5, device="tpu"), torch.randn(5, device="tpu"))  # new shape: recompiles
    assert sim.counters().graphs_compiled == 2


def test_torchdynamo_runs_the_simulators_dispatch_as_a_chip_runs_its_kernels(sim):
    """torch_tpu's operators, factories and transfers are C++, which TorchDynamo never converts. The simulator's are
    Python: an eager stretch of a compiled function (a frame TorchDynamo gives up on, as TRL's fused LM head makes
    of Transformers' output capturing) ran them under TorchDynamo, which converted ``TpuTensor._wrap_cpu`` and
    failed on the half-built tensor ("'TpuTensor' object has no attribute '_cpu'"). They are skipped."""
    from torch._dynamo import trace_rules

    from transformers_tpu_ext.testing import compile_backend, device, factories

    torch.compile(_fn, backend="tpu")(torch.randn(3, device="tpu"), torch.randn(3, device="tpu"))  # TorchDynamo imported
    for module in (device, factories):
        assert trace_rules.check_file(module.__file__).skipped, module.__name__
    assert {"device", "factories", "device_storage", "generators"} <= set(compile_backend.DISPATCH_MODULES)
    assert not trace_rules.check_file(compile_backend.__file__.replace("compile_backend", "tpu_module")).skipped


def test_compile_backend_tpu_rejects_mode(sim):
    x = torch.randn(3, device="tpu")
    with pytest.raises(Exception, match=r"Unexpected keyword arguments: \{'mode': 'reduce-overhead'\}"):
        torch.compile(_fn, backend="tpu", mode="reduce-overhead")(x, x)
    assert torch.compile(_fn, backend="tpu", mode="default")(x, x).device.type == "tpu"


def test_inductor_refuses_tpu_inputs(sim):
    x = torch.randn(3, device="tpu")
    with pytest.raises(Exception, match="inductor cannot compile graphs on TPU tensors"):
        torch.compile(lambda a: a * 2 + 1, backend="inductor")(x)


# --- random numbers: the chip's default generator ---------------------------------------------------


def _draw(probs):
    return torch.multinomial(probs, num_samples=1).squeeze(1)


def test_the_chip_has_its_own_default_generator_seeded_by_manual_seed(sim):
    probs = torch.softmax(torch.randn(4, 50), dim=-1).to("tpu")
    torch.manual_seed(7)
    first = _draw(probs).cpu()
    torch.manual_seed(7)
    torch.rand(1000)  # the CPU's generator draws: the chip's stream does not move
    assert torch.equal(_draw(probs).cpu(), first)
    torch.tpu.manual_seed(7)  # torch_tpu's own seeding API reaches the same generator
    assert torch.equal(_draw(probs).cpu(), first)
    assert torch.tpu.default_generators[0].initial_seed() == 7


def test_compiled_graphs_draw_from_the_chip_generator_at_run_time(sim):
    probs = torch.softmax(torch.randn(2, 1000), dim=-1).to("tpu")
    compiled = torch.compile(_draw, backend="tpu")
    torch.manual_seed(3)
    eager = [_draw(probs).cpu() for _ in range(3)]
    torch.manual_seed(3)
    graph = [compiled(probs).cpu() for _ in range(3)]
    assert all(torch.equal(a, b) for a, b in zip(eager, graph))  # same stream, drawn when the graph runs
    assert not all(torch.equal(graph[0], g) for g in graph[1:])  # not a constant baked in at trace time


# --- a tiny Transformers model ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_models():
    from transformers_tpu_ext.testing.tiny import tiny_model

    return tiny_model("llama", vocab_size=100), tiny_model("llama", vocab_size=100)


def test_tiny_model_forward_matches_cpu(sim, tiny_models):
    cpu_model, tpu_model = tiny_models
    tpu_model.to("tpu")
    assert tpu_model.device.type == "tpu"
    ids = torch.tensor([[5, 6, 7, 8, 9], [1, 2, 3, 4, 5]])
    with torch.no_grad():
        expected = cpu_model(ids).logits
        got = tpu_model(ids.to("tpu")).logits
    assert got.device.type == "tpu"
    assert torch.allclose(got.cpu(), expected, atol=1e-5)
    assert sim.counters().eager_programs > 20


@pytest.mark.parametrize("cache", [None, "static"])
def test_tiny_model_greedy_generate_matches_cpu(sim, tiny_models, cache):
    cpu_model, tpu_model = tiny_models
    tpu_model.to("tpu")
    ids = torch.tensor([[5, 6, 7, 8, 9]])
    kwargs = dict(max_new_tokens=6, do_sample=False, cache_implementation=cache)
    expected = cpu_model.generate(ids, **kwargs)
    got = tpu_model.generate(ids.to("tpu"), **kwargs)
    assert got.device.type == "tpu"
    assert got.cpu().tolist() == expected.tolist()
    # The static cache makes Transformers compile the decode step with backend "tpu".
    assert sim.counters().graphs_compiled == (1 if cache == "static" else 0)


# --- processes --------------------------------------------------------------------------------------


@pytest.mark.slow
def test_env_var_installs_the_simulator_at_import_torch():
    value, _ = run_python(
        """
import torch
from transformers_tpu_ext import testing
props = torch.tpu.get_device_properties()
report([str(torch.accelerator.current_accelerator()), torch.accelerator.device_count(),
        props.name, props.total_memory, testing.simulated_tpu().untie_on_move,
        str(torch.ones(1, device="tpu").device)])
""",
        env={"TRANSFORMERS_TPU_EXT_SIMULATE": "chips=8,generation=v5p,hbm=1GiB,untie_on_move=1"},
    )
    assert value == ["tpu", 8, "TPU v5p", 2**30, True, "tpu:0"]


@pytest.mark.slow
def test_refuses_to_install_where_a_real_tpu_backend_is_active():
    value, _ = run_python(
        """
import torch
torch.utils.rename_privateuse1_backend("tpu")  # what torch_tpu's loader does on a TPU VM
from transformers_tpu_ext import testing
try:
    testing.install()
    report("installed")
except RuntimeError as error:
    report([str(error), testing.is_installed()])
"""
    )
    assert "refusing to install the simulated TPU" in value[0] and "'tpu'" in value[0]
    assert value[1] is False


def test_bad_env_spec_warns_and_import_torch_goes_on():
    value, stderr = run_python(
        """
import torch
report(torch.accelerator.current_accelerator(check_available=True) is None)
""",
        env={"TRANSFORMERS_TPU_EXT_SIMULATE": "chips=4,colour=blue"},
    )
    assert value is True
    assert "TRANSFORMERS_TPU_EXT_SIMULATE='chips=4,colour=blue': unknown key 'colour'" in stderr


def test_pytest_plugin_imports_without_torch_or_installing():
    value, _ = run_python(
        """
import transformers_tpu_ext.testing.pytest_plugin as plugin
from transformers_tpu_ext import testing
report(["torch" in sys.modules, testing.is_installed(), hasattr(plugin, "simulated_tpu")])
"""
    )
    assert value == [False, False, True]


def test_accelerator_empty_cache_works_as_on_a_chip(simulated_tpu):
    """torch_tpu's allocator is a c10 device allocator, so ``torch.accelerator.empty_cache()`` works on a
    chip; PyTorch fails an internal assertion for a Python backend's. Accelerate 1.16 calls it at the
    start of every ``Trainer.train()`` (``free_memory``): the simulator answers it for the TPU."""
    from accelerate.utils.memory import clear_device_cache

    kept = torch.ones(4, device="tpu")
    torch.accelerator.empty_cache()
    clear_device_cache(garbage_collection=True)  # whichever backend module this Accelerate picks
    assert kept.cpu().tolist() == [1.0] * 4


def test_a_tensor_made_from_tpu_scalars_reads_them_like_a_chip(sim):
    # Qwen2-VL's get_rope_index: torch.tensor([positions.max() + 1 - n, ...], device=...). PyTorch reads each
    # element with item() with the Python dispatcher excluded, where a Python backend's kernel is not found.
    positions = torch.arange(5, device="tpu")
    before = sim.counters()
    made = torch.tensor([positions.max() + 1 - 3, positions.max() - 1], device="tpu")
    assert made.device.type == "tpu" and made.cpu().tolist() == [2, 3]
    assert (sim.counters() - before).d2h_bytes >= 16  # each element read on the host, as item() does on a chip
    assert torch.tensor([1, positions[2]]).tolist() == [1, 2] and torch.as_tensor([positions[1], positions[2]]).tolist() == [1, 2]
