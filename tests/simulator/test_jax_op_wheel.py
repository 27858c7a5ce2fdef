"""torch-tpu's own ``jax_op`` (the wheel's Python code, ``tests/_torch_tpu_wheel.py``) against the simulator's
and against every kernel op the serving plugin registers (needs JAX and the wheel's sources).

``scripts/check_torch_tpu.sh`` runs this file where torch-tpu is installed (``TORCH_TPU_SOURCES_REQUIRED=1``:
it fails instead of skipping without the sources); elsewhere ``TORCH_TPU_SOURCES=<dir holding torch_tpu/>``
points at the unpacked wheel. What it proves:

- the wheel's ``jax_op`` registers each variant of ``serving.kernel_call`` (head sizes 128/256 and 64
  lane-packed, bf16/float32 and int8 pages, every chip generation's block sizes) with the schema the simulator
  gives it, and its fake kernel *lowers* the JAX function for the TPU (``jax.export`` for ``platforms=["tpu"]``,
  JAX's Mosaic lowering of the kernel, under an abstract TPU device: this machine has none) with the sliding
  windows and soft caps of real models;
- the wheel and the simulator accept and refuse the same functions with the same messages and schemas: among
  them the plugin's former call, a ``functools.partial`` of JAX's kernel, which both refuse ("The return
  annotation is invalid").
"""

from __future__ import annotations

import enum
import functools
import typing
from typing import Literal, Optional, Sequence

import pytest
import torch

jax = pytest.importorskip("jax")
rpa = pytest.importorskip("jax.experimental.pallas.ops.tpu.ragged_paged_attention")
import jax.numpy as jnp  # noqa: E402

from _torch_tpu_wheel import load_pallas  # noqa: E402
from transformers_tpu_ext.serving import kernel_call, kernel_path  # noqa: E402
from transformers_tpu_ext.testing import pallas as simulated  # noqa: E402


@pytest.fixture(scope="module")
def wheel():
    return load_pallas()


_names = iter(range(10**6))


def _wheel_schema(wheel, fn):
    op = wheel.jax_op(f"tests_wheel::op_{next(_names)}", fn)
    return str(op._opoverload._schema).split("(", 1)[1].join(["(", ""]), op


def _normalized(schema: str) -> str:
    """A schema as a registered op prints it (``1.0`` as ``1.``, dtypes by number)."""
    return "(" + str(torch._C.parse_schema("ns::op" + schema)).split("(", 1)[1]


def _outcome(call):
    try:
        return "ok", call()
    except Exception as error:  # noqa: BLE001 - compared as they come
        return type(error).__name__, str(error)


# --- functions both must judge alike ----------------------------------------------------------------


class Mode(enum.Enum):
    A = "a"
    B = "b"


def f_ok(x: jax.Array, y: jax.Array, *, n: int = 2, scale: float = 1.0, name: str = "s") -> jax.Array:
    return x


def f_tuple(x: jax.Array, k: int) -> tuple[jax.Array, jax.Array]:
    return x, x


def f_seq(xs: Sequence[jax.Array], flag: bool = False) -> list[jax.Array]:
    return list(xs)


def f_optional(x: jax.Array, window: int | None = None, cap: Optional[float] = None) -> jax.Array | None:
    return x


def f_enum(x: jax.Array, mode: Mode = Mode.A, kind: Literal["x", "y"] = "x", dt: jnp.dtype = jnp.float32) -> jax.Array:
    return x


def f_scalar(x: jax.Array) -> int:
    return 1


def f_no_return(x: jax.Array, y: jax.Array):  # noqa: ANN201 - what torch_tpu refuses
    return x


def f_unannotated(x, y: jax.Array) -> jax.Array:  # noqa: ANN001
    return y


def f_bad_arg(x: jax.Array, table: dict) -> jax.Array:
    return x


def f_bad_return(x: jax.Array) -> dict:
    return {}


def f_bad_element(xs: list[jax.Array | None]) -> jax.Array:
    return xs[0]


FUNCTIONS = {
    "kernel_partial": functools.partial(rpa.ragged_paged_attention, sm_scale=0.125),  # the plugin's call before
    "kernel": rpa.ragged_paged_attention,
    "ok": f_ok, "tuple": f_tuple, "seq": f_seq, "optional": f_optional, "enum": f_enum, "scalar": f_scalar,
    "no_return": f_no_return, "unannotated": f_unannotated, "bad_arg": f_bad_arg, "bad_return": f_bad_return,
    "bad_element": f_bad_element, "partial_ok": functools.partial(f_ok, n=3),
    "partial_bad_arg": functools.partial(f_bad_arg, table={}),
    "variant": kernel_call.make(kernel_path.KernelVariant()),
}


@pytest.mark.parametrize("name", sorted(FUNCTIONS))
def test_the_simulator_accepts_and_refuses_what_the_wheel_does_with_its_schema(wheel, name):
    fn = FUNCTIONS[name]
    wheel_result = _outcome(lambda: _wheel_schema(wheel, fn)[0])
    simulated_result = _outcome(lambda: (simulated.verify_signature(fn), _normalized(simulated.op_schema(fn)))[1])
    assert simulated_result == wheel_result


def test_the_plugins_former_call_is_refused_by_both(wheel):
    kind, message = _outcome(lambda: _wheel_schema(wheel, FUNCTIONS["kernel_partial"]))
    assert kind == "ValueError" and "The return annotation is invalid" in message


# --- every variant the plugin registers, registered and lowered by the wheel ---------------------------------

VARIANTS = [
    # (generation, head_dim, heads, kv_heads, model dtype, int8 pages)
    ("v6e", 128, 8, 2, torch.bfloat16, False),
    ("v5e", 256, 8, 4, torch.bfloat16, False),  # Gemma 2/3's head size
    ("v6e", 64, 32, 8, torch.bfloat16, False),  # Llama 3.2 1B: two heads per 128 lanes
    ("v6e", 64, 14, 2, torch.bfloat16, False),  # Qwen2.5 0.5B
    ("v7", 128, 16, 8, torch.bfloat16, True),  # int8 pages
    ("v6e", 64, 16, 8, torch.bfloat16, True),
    ("v5p", 128, 8, 2, torch.float32, False),
    ("v4", 64, 8, 4, torch.float32, True),
]
STATICS = [  # (sm_scale, sliding_window, soft_cap): Llama, Mistral's window, Gemma 2's window and soft cap
    (0.125, None, None), (0.0884, 4096, None), (0.0625, 4096, 50.0),
]


@pytest.mark.parametrize("generation, head_dim, heads, kv_heads, dtype, int8", VARIANTS)
def test_the_wheel_registers_and_lowers_every_kernel_variant_the_plugin_registers(
    wheel, generation, head_dim, heads, kv_heads, dtype, int8
):
    lanes = kernel_path.lane_packing(head_dim, kv_heads)
    variant = kernel_path.KernelVariant(generation=generation, lanes=lanes, int8=int8)
    fn = kernel_call.make(variant)
    schema, op = _wheel_schema(wheel, fn)
    assert schema == _normalized(simulated.op_schema(fn))
    # A step of 64 tokens, 8 sequences of up to 16 pages of 16 tokens (as meta tensors: the wheel's fake
    # kernel lowers the function for the chip, as the op's first call on a TPU does).
    pages = torch.empty(256, 16, 2 * kv_heads // lanes, lanes * head_dim, dtype=torch.int8 if int8 else dtype, device="meta")
    q = torch.empty(64, heads, head_dim, dtype=dtype, device="meta")
    ints = [torch.empty(shape, dtype=torch.int32, device="meta") for shape in ((8,), (8, 16), (9,), (1,))]
    kind = simulated.DEVICE_KINDS[generation]
    mesh = jax.sharding.AbstractMesh(
        (1,), ("x",), axis_types=(jax.sharding.AxisType.Auto,), abstract_device=jax.sharding.AbstractDevice(kind, 1, "tpu")
    )
    for scale, window, cap in STATICS:
        with jax.sharding.use_abstract_mesh(mesh):
            out = op(q, pages, *ints, sm_scale=scale, sliding_window=window, soft_cap=cap)
        assert out.shape == q.shape and out.dtype == dtype


# --- the experts' grouped matmuls (experts.kernel), registered and lowered by the wheel --------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_wheel_registers_and_lowers_the_experts_grouped_matmuls(wheel, dtype):
    from transformers_tpu_ext.experts import kernel as experts_kernel
    from transformers_tpu_ext.experts import policy as experts_policy

    pytest.importorskip(experts_policy.KERNEL)
    gmm, tgmm = experts_kernel._functions()
    m, k, n, groups = 64, 256, 512, 4  # 64 routed rows, hidden 256, expert width 512, 4 experts
    calls = {
        "gmm": (functools.partial(gmm, transpose_rhs=False), [(m, k), (groups, k, n)], (m, n)),
        "gmm_t": (functools.partial(gmm, transpose_rhs=True), [(m, k), (groups, n, k)], (m, n)),
        "tgmm": (tgmm, [(k, m), (m, n)], (groups, k, n)),
    }
    mesh = jax.sharding.AbstractMesh(
        (1,), ("x",), axis_types=(jax.sharding.AxisType.Auto,),
        abstract_device=jax.sharding.AbstractDevice(simulated.DEVICE_KINDS["v6e"], 1, "tpu"),
    )
    for name, (fn, shapes, expected) in calls.items():
        schema, op = _wheel_schema(wheel, fn)
        assert schema == _normalized(simulated.op_schema(fn)), name
        args = [torch.empty(shape, dtype=dtype, device="meta") for shape in shapes]
        args.append(torch.empty(groups, dtype=torch.int32, device="meta"))
        with jax.sharding.use_abstract_mesh(mesh):
            out = op(*args)
        assert tuple(out.shape) == expected and out.dtype == dtype, name
