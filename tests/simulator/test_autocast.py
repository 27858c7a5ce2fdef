"""``torch.autocast("tpu")`` on the simulated TPU follows torch_tpu's policy; measured against CPU autocast.

docs/simulated-tpu.md's autocast table is checked here, operator by operator, on both sides: what the
simulated TPU computes in, and what CPU autocast computes in. docs/training.md's bf16 claim is the
Trainer measurement below.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
F = torch.nn.functional

from transformers_tpu_ext.testing import autocast  # noqa: E402

DOCS = Path(__file__).resolve().parents[2] / "docs" / "simulated-tpu.md"


def _inputs(dtype: torch.dtype, device: str) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen).to(dtype).to(device)

    return {
        "x": rand(4, 8), "w": rand(8, 8), "b3": rand(2, 4, 8), "w3": rand(2, 8, 8), "img": rand(1, 2, 5, 5),
        "k2": rand(3, 2, 3, 3), "q": rand(1, 2, 4, 8), "t": torch.tensor([1, 0, 3, 2], device=device),
    }


#: One call per operator named in the docs table.
CALLS = {
    "mm": lambda i: torch.mm(i["x"], i["w"]),
    "bmm": lambda i: torch.bmm(i["b3"], i["w3"]),
    "addmm": lambda i: torch.addmm(i["x"], i["x"], i["w"]),
    "matmul": lambda i: torch.matmul(i["x"], i["w"]),
    "linear": lambda i: F.linear(i["x"], i["w"]),
    "einsum": lambda i: torch.einsum("ij,jk->ik", i["x"], i["w"]),
    "conv2d": lambda i: F.conv2d(i["img"], i["k2"]),
    "scaled_dot_product_attention": lambda i: F.scaled_dot_product_attention(i["q"], i["q"], i["q"]),
    "cross_entropy": lambda i: F.cross_entropy(i["x"], i["t"]),
    "nll_loss": lambda i: F.nll_loss(i["x"], i["t"]),
    "mse_loss": lambda i: F.mse_loss(i["x"], i["w"][:4]),
    "fft_rfft": lambda i: torch.fft.rfft(i["x"]).real,
    "layer_norm": lambda i: F.layer_norm(i["x"], (8,)),
    "group_norm": lambda i: F.group_norm(i["img"], 2),
    "rms_norm": lambda i: F.rms_norm(i["x"], (8,)),
    "linalg_vector_norm": lambda i: torch.linalg.vector_norm(i["x"]),
    "softmax": lambda i: torch.softmax(i["x"], -1),
    "log_softmax": lambda i: torch.log_softmax(i["x"], -1),
    "silu": lambda i: F.silu(i["x"]),
    "sum": lambda i: i["x"].sum(),
}


#: The aten operator behind a call, where its name differs.
ATEN = {"cross_entropy": "cross_entropy_loss"}


def _policy(op: str) -> str:
    return autocast.POLICY.get(ATEN.get(op, op), "fallthrough")


def _computes_in(op: str, device: str) -> str:
    """The dtype ``op`` computes in under bf16 autocast: float32 inputs for the lower-precision operators
    (do they go down?), bfloat16 inputs for the others (do they go up?)."""
    lower = _policy(op) == "lower"
    inputs = _inputs(torch.float32 if lower else torch.bfloat16, device)
    with torch.autocast(device, dtype=torch.bfloat16):
        out = CALLS[op](inputs)
    return str(out.dtype).removeprefix("torch.")


def _docs_table() -> list[tuple[list[str], str, str]]:
    text = DOCS.read_text()
    table = text.split("<!-- autocast table: checked by tests/simulator/test_autocast.py -->", 1)[1]
    rows = []
    for line in [line.strip() for line in table.strip().splitlines()][2:]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip("|").split("|")]
        ops = re.findall(r"`([a-z_0-9]+)`", cells[0])
        rows.append((ops, cells[1], cells[2]))
    return rows


def test_the_docs_table_names_every_family_of_the_policy():
    rows = _docs_table()
    assert len(rows) == 4
    named = {op for ops, _, _ in rows for op in ops}
    assert named == set(CALLS)
    assert {_policy(op) for op in named} == {"lower", "float32", "fallthrough"}


@pytest.mark.parametrize("row", range(4))
def test_each_operator_computes_in_the_documented_dtype_on_the_simulator_and_under_cpu_autocast(simulated_tpu, row):
    ops, on_tpu, on_cpu = _docs_table()[row]

    def expected(cell: str, op: str) -> str:
        return "bfloat16" if cell.startswith("the input's") else cell.split()[0]

    for op in ops:
        policy = _policy(op)
        assert _computes_in(op, "tpu") == expected(on_tpu, op) == {"lower": "bfloat16", "float32": "float32",
                                                                   "fallthrough": "bfloat16"}[policy], op
        assert _computes_in(op, "cpu") == expected(on_cpu, op), op


def test_lower_precision_values_equal_cpu_autocast(simulated_tpu):
    linear, x = torch.nn.Linear(4, 4), torch.randn(2, 4)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        expected = linear(x)
    linear.to("tpu")
    with torch.autocast("tpu", dtype=torch.bfloat16):
        got = linear(x.to("tpu"))
    assert got.dtype == torch.bfloat16 and torch.equal(got.cpu(), expected)
