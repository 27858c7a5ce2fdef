"""Worker of test_kv_int8.py: runs in a fresh interpreter (tests/_subprocess.run_python) and reports one JSON value."""
from _worker import report
import logging
import torch
from transformers import StaticCache
from transformers.cache_utils import StaticLayer
from transformers_tpu_ext import testing
from transformers_tpu_ext.generation import config as settings, static_cache
from transformers_tpu_ext.quantization import capacity, kv_cache
from transformers_tpu_ext.quantization.runtime import count
from transformers_tpu_ext.testing.tiny import check_context_sensitive, tiny_model

sim = testing.install(chips=1)
model = tiny_model("qwen3", seed=0, head_dim=64)
check_context_sensitive(model)
ids = torch.randint(2, model.config.vocab_size, (2, 11), generator=torch.Generator().manual_seed(3))  # int8 tokens differ here
NEW = 10
r = {}

made = []  # every static cache the plugin makes (its layers as the step sees them)
original = static_cache.full_length_layers
def spy(cache, length):
    made.append(cache)
    return original(cache, length)
static_cache.full_length_layers = spy

messages = []
class Keep(logging.Handler):
    def emit(self, record):
        messages.append(record.getMessage())
logging.getLogger("transformers_tpu_ext").addHandler(Keep())

# The CPU reference of the same math, written here (not the plugin's layer): a float static layer storing
# each new key/value quantize-dequantized (absmax/127 per position and head): the values the int8 layer's
# attention reads, bit for bit.
def fake_quant(states):
    scale = states.float().abs().amax(-1, keepdim=True).clamp(min=1e-8) / 127
    return (torch.round(states.float() / scale).clamp(-127, 127).to(torch.int8).float() * scale).to(states.dtype)

class FakeQuantLayer(StaticLayer):
    def update(self, key_states, value_states, *args, **kwargs):
        return super().update(fake_quant(key_states), fake_quant(value_states), *args, **kwargs)

def cpu_int8(rows, beams=1, **kw):
    cache = StaticCache(config=model.config, max_cache_len=64)
    cache.layers = [FakeQuantLayer(max_cache_len=64) for _ in cache.layers]
    return model.generate(ids[:rows], max_new_tokens=NEW, do_sample=False, num_beams=beams, cache=cache, **kw), cache

# CPU references (plugin inactive off TPU): the same int8 layer through upstream's generate(), and the float cache.
ref_int8, ref_cache = cpu_int8(2)
ref_beam = cpu_int8(2, beams=3, return_dict_in_generate=True, output_scores=True)[0]
logits_int8 = cpu_int8(2, return_dict_in_generate=True, output_logits=True)[0].logits
logits_float = model.generate(ids, max_new_tokens=NEW, do_sample=False, cache_implementation="static",
                              return_dict_in_generate=True, output_logits=True).logits

model.to("tpu")
def run(kv, **kw):
    settings.configure(kv_cache=kv)
    made.clear()
    return model.generate(ids.to("tpu"), max_new_tokens=NEW, do_sample=False, **kw)

def counted(kv):
    torch._dynamo.reset()
    before = sim.counters()
    out = run(kv)
    first = sim.counters() - before
    before = sim.counters()
    again = run(kv)
    second = sim.counters() - before
    return out, first, second

plain, plain_first, plain_second = counted(None)
plain_layers = [type(layer).__name__ for layer in made[0].layers]
int8, int8_first, int8_second = counted("int8")
layers = made[0].layers
r["layers"] = dict(plain=plain_layers, int8=[type(layer).__name__ for layer in layers],
                   dtypes=sorted({str(layer.keys.dtype) for layer in layers}))
ref_float = model.cpu().generate(ids, max_new_tokens=NEW, do_sample=False)
r["tokens"] = dict(int8_equals_cpu_int8=torch.equal(int8.cpu(), ref_int8), plain_equals_cpu_float=torch.equal(plain.cpu(), ref_float),
                   int8_differs_from_float=not torch.equal(ref_int8, ref_float))
model.to("tpu")
# The warm-up compiles what an int8 call runs: a later call within its limits compiles nothing.
import transformers_tpu_ext
settings.configure(kv_cache="int8")
torch._dynamo.reset()
transformers_tpu_ext.warmup(model, max_prompt_length=16, max_new_tokens=NEW, max_batch_size=2)
before = sim.counters()
model.generate(ids[:1, :6].to("tpu"), max_new_tokens=NEW, do_sample=False)
r["after_warmup"] = (sim.counters() - before).programs
r["programs"] = dict(plain=[plain_first.graphs_compiled, plain_first.programs, plain_second.programs],
                     int8=[int8_first.graphs_compiled, int8_first.programs, int8_second.programs],
                     d2h=[plain_second.d2h_bytes, int8_second.d2h_bytes])  # the device loop: token ids only

# Bytes: what the layers hold == what quantization.capacity counts; against the bf16 static cache.
batch, length = layers[0].keys.shape[0], layers[0].max_cache_len
def held_bytes(layers):
    return sum(t.numel() * t.element_size() for layer in layers for t in
               (layer.keys, layer.values, *(getattr(layer, n) for n in ("key_scales", "value_scales") if hasattr(layer, n))))
held = held_bytes(layers)
r["bytes"] = dict(held=held, capacity=capacity.kv_bytes_per_position(count(model.config), "int8") * batch * length)
bf16 = tiny_model("qwen3", seed=0, head_dim=64).to(torch.bfloat16).to("tpu")
sizes = {}
for kv in (None, "int8"):
    settings.configure(kv_cache=kv)
    made.clear()
    bf16.generate(ids.to("tpu"), max_new_tokens=2, do_sample=False)
    sizes[str(kv)] = held_bytes(made[0].layers)
r["bytes"]["bf16"], r["bytes"]["int8_bf16_model"] = sizes["None"], sizes["int8"]

# Logits (host loop: output_logits) against the CPU int8 cache and the float cache.
out = run("int8", return_dict_in_generate=True, output_logits=True)
tpu_logits = torch.stack(out.logits).cpu()
r["logits"] = dict(
    tokens_equal=torch.equal(out.sequences.cpu(), ref_int8),
    close_to_cpu_int8=float((tpu_logits - torch.stack(logits_int8)).abs().max()),
    from_float_cache=float((tpu_logits - torch.stack(logits_float)).abs().max()),
    float_vs_int8_cpu=float((torch.stack(logits_float) - torch.stack(logits_int8)).abs().max()),
)

# The cache handed back: what upstream returns (a plain StaticCache / DynamicCache in the model's dtype),
# holding the dequantized int8 values the attention read.
out = run("int8", return_dict_in_generate=True, cache_implementation="static")
cache = out.cache
written = int(ref_cache.layers[0].get_seq_length())
keys = cache.layers[0].keys[:, :, :written].cpu()
r["returned"] = dict(
    type=type(cache).__name__, layer=type(cache.layers[0]).__name__, dtype=str(cache.layers[0].keys.dtype),
    keys_are_the_int8_values=torch.equal(keys, ref_cache.layers[0].keys[:, :, :written]),
    default=type(run("int8", return_dict_in_generate=True).cache).__name__,
)

# Beam search: reorder_cache moves the scales with the data.
beams = run("int8", num_beams=3, return_dict_in_generate=True, output_scores=True)
r["beams"] = dict(tokens=torch.equal(beams.sequences.cpu(), ref_beam.sequences),
                  scores=float((beams.sequences_scores.cpu() - ref_beam.sequences_scores).abs().max()))

# Upstream's quantized cache stays upstream's; the compiled alternative is said once.
settings.configure(kv_cache=None)
messages.clear()
for _ in range(2):
    try:
        model.generate(ids.to("tpu"), max_new_tokens=2, do_sample=False, cache_implementation="quantized",
                       cache_config={"backend": "fp8"})
    except Exception:
        pass
r["quantized_said"] = sum("GENERATE_KV_CACHE=int8 is the compiled alternative" in m for m in messages)
report(r)
