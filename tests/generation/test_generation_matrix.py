"""Every decoder family x every generation mode on the simulated TPU (the table in docs/generation.md).

For each architecture of ``testing.tiny`` (GQA, tied embeddings, MQA, sliding window, mixed
sliding/global layers, absolute positions, partial rotary) and each mode (greedy, sampling with a
seed, beam search, prompt lookup): a ragged left-padded batch of 3 with its inputs on the TPU gives
the CPU's tokens, on the input's device, with a bounded number of graphs on the first call and no
new program on a second identical call. Prompt lookup (assisted decoding) takes one row at a time,
as upstream requires. Contrastive search and the other Hub decoding recipes need a Hub download
(``custom_generate``), which no test here makes.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from _subprocess import run_python
from transformers_tpu_ext.testing.tiny import ARCHITECTURES

MODES = ("greedy", "sample", "beam", "lookup")

SCRIPT = Path(__file__).with_name("matrix_worker.py")

#: Graphs on a first call: the prefill chunk, the decode step and the token choice (greedy); the
#: sampling choice (sample); the prefill chunk (beam search: its loop runs uncompiled, with static
#: shapes); none (prompt lookup: upstream's dynamic cache). A bound, so a graph per step would fail.
MAX_GRAPHS = {"greedy": 3, "sample": 3, "beam": 1, "lookup": 0}

GROUPS = (ARCHITECTURES[:5], ARCHITECTURES[5:])


@pytest.fixture(scope="module")
def table():
    merged = {}
    for group in GROUPS:
        merged.update(run_python(SCRIPT, env={"ARCHS": ",".join(group)}, timeout=1200)[0])
    return merged


@pytest.mark.slow
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_architecture_by_mode(table, arch, mode):
    r = table[f"{arch}/{mode}"]
    assert r.get("error") is None, r.get("error")
    assert r["match"], "tokens differ from the CPU's"
    assert r["repeat"]
    assert r["device"] == "tpu:0"
    assert r["graphs_first"] <= MAX_GRAPHS[mode]
    assert r["programs_second"] == 0
