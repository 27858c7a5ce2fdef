"""Worker of test_generation_matrix.py: runs in a fresh interpreter (tests/_subprocess.run_python) and reports one JSON value."""
from _worker import report
import os, sys, torch
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
ARCHS = os.environ["ARCHS"].split(",")
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
