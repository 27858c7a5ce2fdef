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

import pytest

from _subprocess import run_python
from transformers_tpu_ext.testing.tiny import ARCHITECTURES

MODES = ("greedy", "sample", "beam", "lookup")

SCRIPT = r"""
import sys, torch
from transformers_tpu_ext import testing
from transformers_tpu_ext.testing.tiny import check_context_sensitive, tiny_model

sim = testing.install(chips=4)
MODES = {
    "greedy": dict(do_sample=False),
    "sample": dict(do_sample=True, top_k=20, temperature=0.8),
    "beam": dict(num_beams=2, do_sample=False),
    "lookup": dict(prompt_lookup_num_tokens=3, do_sample=False),
}
r = {}
for arch in ARCHS:
    model = tiny_model(arch, seed=0)
    check_context_sensitive(model)
    vocab = model.config.vocab_size
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(2, vocab, (3, 12), generator=gen)
    mask = torch.ones_like(ids)
    mask[1, :3] = 0
    mask[2, :7] = 0
    ids[mask == 0] = 0
    rows = [ids[i : i + 1, int((mask[i] == 0).sum()) :] for i in range(3)]

    def generate(device, mode):
        kw = MODES[mode]
        torch.manual_seed(1)
        if mode == "lookup":
            return [model.generate(row.to(device), max_new_tokens=8, **kw).cpu() for row in rows], None
        out = model.generate(ids.to(device), attention_mask=mask.to(device), max_new_tokens=8, **kw)
        return [out.cpu()], out.device

    refs = {mode: generate("cpu", mode)[0] for mode in MODES}
    model.to("tpu")
    for mode in MODES:
        key = f"{arch}/{mode}"
        try:
            before = sim.counters()
            out, device = generate("tpu", mode)
            first = sim.counters() - before
            before = sim.counters()
            again, _ = generate("tpu", mode)
            second = sim.counters() - before
            r[key] = dict(
                match=all(torch.equal(a, b) for a, b in zip(out, refs[mode])),
                repeat=all(torch.equal(a, b) for a, b in zip(again, out)),
                device=str(device) if device is not None else "tpu:0",
                graphs_first=first.graphs_compiled,
                programs_second=second.programs,
            )
        except Exception as error:
            r[key] = dict(error=f"{type(error).__name__}: {error}"[:300])
    torch._dynamo.reset()
report(r)
"""

#: Graphs on a first call: the prefill chunk, the decode step and the token choice (greedy); the
#: sampling choice (sample); the prefill chunk (beam search: its loop runs uncompiled, with static
#: shapes); none (prompt lookup: upstream's dynamic cache). A bound, so a graph per step would fail.
MAX_GRAPHS = {"greedy": 3, "sample": 3, "beam": 1, "lookup": 0}

GROUPS = (ARCHITECTURES[:5], ARCHITECTURES[5:])


@pytest.fixture(scope="module")
def table():
    merged = {}
    for group in GROUPS:
        merged.update(run_python(f"ARCHS = {list(group)!r}\n" + SCRIPT, timeout=1200)[0])
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
