"""Worker of test_kv_int8_serving.py: runs in a fresh interpreter (tests/_subprocess.run_python) and reports one JSON value."""
from _worker import report
import torch
from transformers import GenerationConfig, StaticCache
from transformers.cache_utils import StaticLayer
from transformers_tpu_ext import testing
from transformers_tpu_ext.serving import policy as serving
from transformers_tpu_ext.testing.tiny import check_context_sensitive, tiny_model

sim = testing.install(chips=1, hbm_bytes="128MiB")
gc = GenerationConfig(do_sample=False, eos_token_id=1, pad_token_id=0)
r = {}

def fake_quant(states):
    scale = states.float().abs().amax(-1, keepdim=True).clamp(min=1e-8) / 127
    return (torch.round(states.float() / scale).clamp(-127, 127).to(torch.int8).float() * scale).to(states.dtype)

class FakeQuantLayer(StaticLayer):
    def update(self, key_states, value_states, *args, **kwargs):
        return super().update(fake_quant(key_states), fake_quant(value_states), *args, **kwargs)

model = tiny_model("qwen3", seed=0, head_dim=64)
check_context_sensitive(model)
gen = torch.Generator().manual_seed(2)  # prompts whose int8 tokens differ from the float cache's
lengths, news = [1, 40, 9, 17, 25], [8, 3, 8, 6, 8]
ps = [torch.randint(2, model.config.vocab_size, (n,), generator=gen).tolist() for n in lengths]

def reference(int8):
    out = []
    for p, n in zip(ps, news):
        kw = {}
        if int8:
            cache = StaticCache(config=model.config, max_cache_len=64)
            cache.layers = [FakeQuantLayer(max_cache_len=64) for _ in cache.layers]
            kw["cache"] = cache
        out.append(model.generate(torch.tensor([p]), max_new_tokens=n, min_new_tokens=n, do_sample=False, **kw)[0, len(p):].tolist())
    return out

ref_int8, ref_float = reference(True), reference(False)
model.to("tpu")
serving.configure(kv_cache="int8")
manager = model.init_continuous_batching(generation_config=gc)
plan = manager.continuous_batching_config.tpu_plan
before = sim.counters()
manager.warmup()
warm = sim.counters() - before
manager.start()
before = sim.counters()
ids = [manager.add_request(p, max_new_tokens=n) for p, n in zip(ps, news)]
results = {}
while len(results) < len(ids):
    out = manager.get_result(timeout=60)
    assert out is not None, "no result"
    if out.is_finished():
        results[out.request_id] = out.generated_tokens
stream = sim.counters() - before
got = [results[i] for i in ids]
cache = manager.batch_processor.cache
(allocator,) = cache.cache_allocators.values()
scales = allocator._tpu_ext_kv_scales
r["tokens"] = dict(equal_cpu_int8=got == ref_int8, differ_from_float=[a != b for a, b in zip(got, ref_float)])
r["programs"] = dict(warmup_graphs=warm.graphs_compiled, shapes=len(plan.shapes), stream=stream.programs)
r["bytes"] = dict(pages_dtype=str(allocator.cache_tensor.dtype), held=cache.cache_tensor.numel() + scales.numel() * 4,
                  plan=plan.cache.cache_bytes, format=plan.asdict()["kv_cache_format"])

# A fork copies whole blocks: the scales must follow the pages.
rows = allocator.block_physical_stride
written = [b for b in range(2, scales.shape[0] // rows) if scales[b * rows:(b + 1) * rows].abs().sum() > 0]
source, dest = written[0], scales.shape[0] // rows - 1
allocator.copy_blocks([source], [dest])
flat = allocator.cache_tensor.view(-1, allocator.num_key_value_heads, allocator.head_dim)
r["fork"] = dict(
    scales=torch.equal(scales[dest * rows:(dest + 1) * rows].cpu(), scales[source * rows:(source + 1) * rows].cpu()),
    pages=torch.equal(flat[dest * rows:(dest + 1) * rows].cpu(), flat[source * rows:(source + 1) * rows].cpu()),
)
manager.stop(block=True)
manager.destroy()

# The pool of a bf16 model: int8 pages hold about twice the tokens (one more step's worth of HBM aside).
capacity = {}
bf16 = tiny_model("qwen3", seed=0, head_dim=64).to(torch.bfloat16).to("tpu")
for kv in (None, "int8"):
    serving.configure(kv_cache=kv)
    m = bf16.init_continuous_batching(generation_config=gc)
    processor = m._create_batch_processor()
    capacity[str(kv)] = processor.cache.num_sectors * processor.cache.tokens_per_sector
    m.destroy()
r["capacity"] = capacity
report(r)
