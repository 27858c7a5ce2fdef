"""Worker of test_generation.py: runs in a fresh interpreter (tests/_subprocess.run_python) and reports one JSON value."""
from _worker import report
import warnings
import torch
from transformers import CompileConfig, StoppingCriteria
from transformers.generation.streamers import BaseStreamer
from transformers_tpu_ext import testing
from transformers_tpu_ext.testing.tiny import check_context_sensitive, tiny_model

sim = testing.install(chips=4)
model = tiny_model("qwen3", seed=0)
check_context_sensitive(model)
gen = torch.Generator().manual_seed(0)
def prompt(batch, length):
    return torch.randint(2, model.config.vocab_size, (batch, length), generator=gen)

single = prompt(1, 7)
same_bucket = [prompt(1, n) for n in (5, 9, 14)]
ragged = prompt(3, 11)
ragged_mask = torch.ones_like(ragged)
ragged_mask[1, :4] = 0
ragged_mask[2, :7] = 0
ragged[ragged_mask == 0] = 0
cpu = lambda **kw: model.generate(do_sample=False, **kw)
refs = {
    "single": cpu(inputs=single, max_new_tokens=8),
    "bucket": [cpu(inputs=p, max_new_tokens=6) for p in same_bucket],
    "ragged": cpu(input_ids=ragged, attention_mask=ragged_mask, max_new_tokens=5),
    "beam": cpu(inputs=single, max_new_tokens=5, num_beams=2),
    "max_length": cpu(inputs=single, max_length=12),
}
eos = int(refs["single"][0, 7 + 3])  # the 4th generated token
refs["eos"] = cpu(inputs=single, max_new_tokens=8, eos_token_id=eos)

model.to("tpu")
r = {}
def run(name, **kw):
    before = sim.counters()
    out = model.generate(**kw)
    return out, sim.counters() - before

out, first = run("tpu", inputs=single.to(model.device), max_new_tokens=8)
_, second = run("tpu", inputs=single.to(model.device), max_new_tokens=8)
r["tpu_inputs"] = dict(device=str(out.device), match=torch.equal(out.cpu(), refs["single"]),
                       graphs=first.graphs_compiled, second_call_programs=second.programs)

with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    try:
        for _ in range(2):
            out = model.generate(single, max_new_tokens=8, do_sample=False, compile_config=CompileConfig(),
                                 cache_implementation="static")
        r["compile_config"] = dict(ok=True, match=torch.equal(out, refs["single"]))
    except Exception as error:
        r["compile_config"] = dict(ok=False, error=type(error).__name__)
r["compile_config"]["warnings"] = [str(w.message) for w in caught if "CompileConfig" in str(w.message)]

progs = []
matches = []
for p, ref in zip(same_bucket, refs["bucket"]):
    out, delta = run("bucket", inputs=p, max_new_tokens=6, do_sample=False)
    progs.append(delta.programs)
    matches.append(torch.equal(out, ref))
r["same_bucket"] = dict(programs=progs, match=all(matches))

out, _ = run("ragged", input_ids=ragged, attention_mask=ragged_mask, max_new_tokens=5, do_sample=False)
r["ragged_batch"] = dict(shape=list(out.shape), match=torch.equal(out, refs["ragged"]))

samples = []
for _ in range(2):
    torch.manual_seed(3)
    samples.append(model.generate(ragged, attention_mask=ragged_mask, max_new_tokens=6, do_sample=True,
                                  num_return_sequences=2))
r["sampling"] = dict(reproducible=torch.equal(*samples), shape=list(samples[0].shape))

class Collect(BaseStreamer):
    def __init__(self): self.parts = []
    def put(self, value): self.parts.append(value.clone())
    def end(self): self.ended = True
streamer = Collect()
out = model.generate(single, max_new_tokens=8, do_sample=False, streamer=streamer)
streamed = torch.cat([streamer.parts[0][0]] + [p.reshape(-1) for p in streamer.parts[1:]])
r["streamer"] = dict(prompt_unpadded=torch.equal(streamer.parts[0], single), all_tokens=torch.equal(streamed, out[0]),
                     ended=getattr(streamer, "ended", False))

out, _ = run("beam", inputs=single, max_new_tokens=5, num_beams=2, do_sample=False)
r["beam"] = dict(match=torch.equal(out, refs["beam"]))
out, delta = run("nocompile", inputs=single, max_new_tokens=8, do_sample=False, disable_compile=True)
r["disable_compile"] = dict(match=torch.equal(out, refs["single"]), graphs=delta.graphs_compiled)
out, _ = run("max_length", inputs=single, max_length=12, do_sample=False)
r["max_length"] = dict(match=torch.equal(out, refs["max_length"]))
out, _ = run("eos", inputs=single, max_new_tokens=8, do_sample=False, eos_token_id=eos)
r["eos"] = dict(match=torch.equal(out, refs["eos"]), length=out.shape[1])

import transformers_tpu_ext
try:
    shapes = transformers_tpu_ext.warmup(model, max_batch_size=2, max_prompt_length=40, max_new_tokens=8)
    after = []
    for ids, new in ((prompt(2, 37), 8), (prompt(1, 20), 3), (prompt(2, 5), 6), (prompt(1, 16), 4), (prompt(1, 32), 5)):
        _, delta = run("after_warmup", inputs=ids, max_new_tokens=new, do_sample=False)
        after.append(delta.programs)
    r["warmup"] = dict(shapes=len(shapes), programs_after=after)
except Exception as error:
    r["warmup"] = dict(error=repr(error))
report(r)
