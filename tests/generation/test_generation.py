"""generate() on the simulated TPU: plain code, fast, token-identical (patch ``generation``).

Fresh interpreters run the scenarios (patches and the simulator are process-global) and report what
a user would see; one runs the same script with the patch disabled, to show those facts come from
the patch. Every token comparison uses a context-sensitive tiny model (asserted in the script), so
attending to the wrong positions changes the tokens (``test_generation_mutation.py`` proves it).
"""

from __future__ import annotations

import pytest

from _subprocess import run_python

SCRIPT = r"""
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
"""


@pytest.fixture(scope="module")
def with_patch():
    return run_python(SCRIPT, timeout=600)[0]


def test_tpu_inputs_no_cache_argument_compile_and_stay_compiled(with_patch):
    r = with_patch["tpu_inputs"]
    assert r["device"] == "tpu:0"
    assert r["match"]
    assert r["graphs"] >= 1  # the decode step is compiled (static cache by default)
    assert r["second_call_programs"] == 0


def test_user_compile_config_is_adapted_with_one_warning(with_patch):
    r = with_patch["compile_config"]
    assert r["ok"] and r["match"]
    assert len(r["warnings"]) == 1
    assert "mode='reduce-overhead' dropped" in r["warnings"][0] and "'tpu'" in r["warnings"][0]


def test_prompts_in_one_bucket_compile_once_and_match_unpadded_tokens(with_patch):
    r = with_patch["same_bucket"]
    assert r["match"]
    assert r["programs"][1:] == [0, 0]


def test_left_padded_batch_is_bucketed_and_matches(with_patch):
    assert with_patch["ragged_batch"] == {"shape": [3, 16], "match": True}


def test_sampling_with_a_seed_is_reproducible_and_keeps_its_rows(with_patch):
    assert with_patch["sampling"] == {"reproducible": True, "shape": [6, 17]}


def test_streamer_sees_the_unpadded_prompt_and_every_token(with_patch):
    assert with_patch["streamer"] == {"prompt_unpadded": True, "all_tokens": True, "ended": True}


def test_other_modes_and_options_keep_working(with_patch):
    assert with_patch["beam"]["match"]
    assert with_patch["disable_compile"] == {"match": True, "graphs": 0}
    assert with_patch["max_length"]["match"]
    assert with_patch["eos"]["match"] and with_patch["eos"]["length"] < 7 + 8


def test_warmup_compiles_every_bucket_within_the_limits(with_patch):
    r = with_patch["warmup"]
    assert r["shapes"] == 2 * 3  # batch buckets 1, 2 x prompt rungs 16, 32, 64
    # The last two prompts are exactly a rung long (16, 32): their padding column moves them to
    # the next rung, whose masked graph warmup compiled (no mask-less graph of their own).
    assert r["programs_after"] == [0, 0, 0, 0, 0]


def test_without_the_patch_the_same_code_is_slow_or_broken():
    r = run_python(SCRIPT, env={"TRANSFORMERS_TPU_EXT_DISABLE": "generation"}, timeout=600)[0]
    assert r["tpu_inputs"]["graphs"] == 0  # nothing compiled: the dynamic cache grows every step
    assert r["compile_config"]["ok"] is False  # the tpu backend rejects mode="reduce-overhead"
    assert r["same_bucket"]["programs"][1] > 0  # every new prompt length costs new programs


EXTRA = r"""
import logging
import torch
from transformers import T5Config, T5ForConditionalGeneration
from transformers_tpu_ext import testing
from transformers_tpu_ext.testing.tiny import tiny_model

sim = testing.install(chips=4)
records = []
class Keep(logging.Handler):
    def emit(self, record): records.append(record.getMessage())
logging.getLogger("transformers_tpu_ext").addHandler(Keep())
r = {}
gen = torch.Generator().manual_seed(0)

# Encoder-decoder, inputs on the TPU.
torch.manual_seed(0)
t5 = T5ForConditionalGeneration(T5Config(
    vocab_size=96, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_decoder_layers=2, num_heads=4,
    decoder_start_token_id=0, pad_token_id=0, eos_token_id=1, initializer_factor=5.0)).eval()
ids = torch.randint(2, 96, (2, 9), generator=gen)
mask = torch.ones_like(ids)
mask[1, 6:] = 0
ref = t5.generate(ids, attention_mask=mask, max_new_tokens=8, min_new_tokens=8, do_sample=False)
t5.to("tpu")
try:
    out = t5.generate(ids.to("tpu"), attention_mask=mask.to("tpu"), max_new_tokens=8, min_new_tokens=8,
                      do_sample=False)
    r["t5"] = dict(device=str(out.device), match=torch.equal(out.cpu(), ref),
                   distinct=len(set(ref[:, 1:].flatten().tolist())))
except Exception as error:
    r["t5"] = dict(error=f"{type(error).__name__}: {error}"[:300])

# Decoder-only, inputs_embeds + attention_mask on the TPU.
model = tiny_model("qwen3", seed=0)
ids = torch.randint(2, model.config.vocab_size, (2, 9), generator=gen)
mask = torch.ones_like(ids)
mask[1, :3] = 0
embeds = model.get_input_embeddings()(ids).detach()
ref = model.generate(inputs_embeds=embeds, attention_mask=mask, max_new_tokens=6, do_sample=False)
model.to("tpu")
try:
    before = sim.counters()
    out = model.generate(inputs_embeds=embeds.to("tpu"), attention_mask=mask.to("tpu"), max_new_tokens=6,
                         do_sample=False)
    delta = sim.counters() - before
    r["embeds"] = dict(device=str(out.device), match=torch.equal(out.cpu(), ref), graphs=delta.graphs_compiled)
except Exception as error:
    r["embeds"] = dict(error=f"{type(error).__name__}: {error}"[:300])

# A user's mistake (generation options set on model.config) surfaces once, as upstream raises it.
records.clear()
model.config.num_beams = 3
try:
    model.generate(ids.to("tpu"), max_new_tokens=2)
    r["user_error"] = dict(error=None)
except Exception as error:
    r["user_error"] = dict(error=type(error).__name__, message=str(error)[:120])
r["user_error"]["falling_back_logged"] = any("falling back" in m for m in records)
report(r)
"""


@pytest.fixture(scope="module")
def extra():
    return run_python(EXTRA)[0]


def test_encoder_decoder_with_inputs_on_tpu_matches_cpu(extra):
    r = extra["t5"]
    assert r.get("error") is None
    assert r["device"] == "tpu:0"
    assert r["match"] and r["distinct"] > 1


def test_inputs_embeds_on_tpu_match_cpu_and_decode_is_compiled(extra):
    r = extra["embeds"]
    assert r.get("error") is None
    assert r["device"] == "tpu:0"
    assert r["match"]
    assert r["graphs"] >= 1  # static cache by default: the decode step is compiled


def test_users_own_error_surfaces_once_without_a_fallback_log(extra):
    r = extra["user_error"]
    assert r["error"] == "ValueError"
    assert "modified the pretrained model configuration" in r["message"]
    assert r["falling_back_logged"] is False
