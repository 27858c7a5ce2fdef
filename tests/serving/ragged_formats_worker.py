"""Worker of test_ragged_formats.py: runs in a fresh interpreter (tests/_subprocess.run_python) and reports one JSON value."""
from _worker import report
import logging, sys, time
import torch
from transformers import GenerationConfig, StaticCache
from transformers.cache_utils import StaticLayer
from transformers_tpu_ext import testing
from transformers_tpu_ext.serving import policy as serving
from transformers_tpu_ext.testing import pallas as simulated_pallas
from transformers_tpu_ext.testing.tiny import check_context_sensitive, tiny_model

sim = testing.install(chips=1, hbm_bytes="1GiB")  # budget 512 MiB: a max_len gather per token (543 MB) would not fit
gc = GenerationConfig(do_sample=False, eos_token_id=1, pad_token_id=0)
NEW = 6
r = {}

class Said(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.messages = []
    def emit(self, record):
        self.messages.append(record.getMessage())

def prompts(model, lengths, seed):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(2, model.config.vocab_size, (n,), generator=gen).tolist() for n in lengths]

def reference(model, ps, scales=None):
    out = []
    for p in ps:
        kw = {}
        if scales is not None:  # the same int8 math: a scale per layer and key-value head
            cache = StaticCache(config=model.config, max_cache_len=len(p) + NEW)
            cache.layers = [FakeQuantLayer(scales[i], max_cache_len=len(p) + NEW) for i in range(len(cache.layers))]
            kw["cache"] = cache
        out.append(model.generate(torch.tensor([p]), max_new_tokens=NEW, min_new_tokens=NEW, do_sample=False, **kw)[0, len(p):].tolist())
    return out

class FakeQuantLayer(StaticLayer):
    def __init__(self, scales, **kwargs):
        super().__init__(**kwargs)
        self.scales = scales  # [2, kv_heads]
    def update(self, key_states, value_states, *args, **kwargs):  # [1, kv_heads, T, head_dim]
        k, v = (torch.round(s.float() / self.scales[i][None, :, None, None]).clamp(-127, 127) * self.scales[i][None, :, None, None]
                for i, s in enumerate((key_states, value_states)))
        return super().update(k.to(key_states.dtype), v.to(value_states.dtype), *args, **kwargs)

def run_batch(manager, ps):
    ids = [manager.add_request(p, max_new_tokens=NEW) for p in ps]
    results = {}
    while len(results) < len(ids):
        out = manager.get_result(timeout=900)
        assert out is not None, "no result"
        if out.is_finished():
            results[out.request_id] = out.generated_tokens
    return [results[i] for i in ids]

T0 = time.perf_counter()
# A. A kernel that fails at registration: the plain-PyTorch attention, one warning, the CPU's tokens.
model = tiny_model("qwen3", seed=0, head_dim=128, num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=1024)
ps = prompts(model, [30, 70, 5], seed=9)
ref = reference(model, ps)
model.to("tpu")
real_jax_op = torch.tpu.pallas.jax_op
def refusing_jax_op(*args, **kwargs):
    raise RuntimeError("forced: this torch_tpu refuses the kernel")
torch.tpu.pallas.jax_op = refusing_jax_op
serving.configure(max_len=128)  # the plain-PyTorch attention gathers max_len keys per token: a short max length
said = Said()
logging.getLogger("transformers_tpu_ext").addHandler(said)
try:
    manager = model.init_continuous_batching(generation_config=gc)
    plan = manager.continuous_batching_config.tpu_plan
    manager.start()
    got = run_batch(manager, ps)
    manager.stop(block=True)
finally:
    torch.tpu.pallas.jax_op = real_jax_op
    serving.reset()
    logging.getLogger("transformers_tpu_ext").removeHandler(said)
r["forced_failure"] = dict(attention=plan.attention, match=got == ref,
                           warnings=[m for m in said.messages if "ragged paged attention kernel failed" in m],
                           seconds=round(time.perf_counter() - T0, 1))

# B. 12 mixed requests (prompts 100..600 tokens), head sizes 64 and 128, float and int8 pages.
lengths = [100, 600, 250, 430, 120, 510, 333, 175, 580, 260, 405, 140]
for head_dim in (64, 128):
    for kv_cache in (None, "int8"):
        name = f"{head_dim}_{kv_cache or 'float'}"
        T0 = time.perf_counter()
        model = tiny_model("qwen3", seed=1, head_dim=head_dim, num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=1024)
        check_context_sensitive(model)
        ps = prompts(model, lengths, seed=head_dim)
        cpu_model = model
        model = tiny_model("qwen3", seed=1, head_dim=head_dim, num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=1024).to("tpu")
        serving.configure(kv_cache=kv_cache)
        manager = model.init_continuous_batching(generation_config=gc)
        plan = manager.continuous_batching_config.tpu_plan
        manager.warmup()
        manager.start()
        simulated_pallas.STATS.reset()
        got = run_batch(manager, ps)
        first = plan.stats.asdict()
        cache = manager.batch_processor.cache
        (allocator,) = cache.cache_allocators.values()
        scales = getattr(allocator, "_tpu_ext_kv_head_scales", None)
        scales = None if scales is None else scales.cpu()
        calls = simulated_pallas.STATS.calls
        before = sim.counters()
        torch.tpu._set_cache_only(True)  # a program the warm-up did not compile raises
        try:
            again = run_batch(manager, ps)
        finally:
            torch.tpu._set_cache_only(False)
        second = sim.counters() - before
        manager.stop(block=True)
        serving.reset()
        ref = reference(cpu_model, ps, None if scales is None else [scales[i] for i in range(scales.shape[0])])
        r[name] = dict(
            attention=plan.attention, lanes=plan.kernel_variant.lanes if plan.kernel_variant else None,
            pages_dtype=str(allocator.cache_tensor.dtype), match=got == ref, again=again == got,
            second_batch_programs=second.programs, kernel_calls=calls,
            decode_ratio=first["decode_kv_read_over_held"], kv_bytes_read=first["kv_bytes_read"], kv_bytes_held=first["kv_bytes_held"],
            simulated_read=simulated_pallas.STATS.kv_bytes_read, page_size=plan.page_size,
            cache_bytes=plan.cache.cache_bytes, step_bytes=plan.cache.step_bytes, budget=plan.cache.budget,
            seconds=round(time.perf_counter() - T0, 1),
        )
        print(name, r[name], file=sys.stderr, flush=True)
report(r)
