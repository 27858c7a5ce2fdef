"""Worker of test_ragged_serving.py: runs in a fresh interpreter (tests/_subprocess.run_python) and reports one JSON value."""
from _worker import report
import logging, sys
import torch
from transformers import GenerationConfig
from transformers_tpu_ext import testing
from transformers_tpu_ext.serving import policy as serving
from transformers_tpu_ext.testing import pallas as simulated_pallas
from transformers_tpu_ext.testing.tiny import check_context_sensitive, tiny_model

sim = testing.install(chips=1, hbm_bytes="128MiB")
gc = GenerationConfig(do_sample=False, eos_token_id=1, pad_token_id=0)
r = {}

def prompts(model, lengths, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(2, model.config.vocab_size, (n,), generator=gen).tolist() for n in lengths]

def reference(model, ps, news):
    return [model.generate(torch.tensor([p]), max_new_tokens=n, min_new_tokens=n, do_sample=False)[0, len(p):].tolist()
            for p, n in zip(ps, news)]

def serve(model, ps, news, cache_only=True):
    manager = model.init_continuous_batching(generation_config=gc)
    plan = manager.continuous_batching_config.tpu_plan
    manager.warmup()
    manager.start()
    simulated_pallas.STATS.reset()
    before = sim.counters()
    torch.tpu._set_cache_only(cache_only)  # a program the warm-up did not compile raises
    try:
        ids = [manager.add_request(p, max_new_tokens=n) for p, n in zip(ps, news)]
        results = {}
        while len(results) < len(ids):
            out = manager.get_result(timeout=600)
            assert out is not None, "no result"
            if out.is_finished():
                results[out.request_id] = out.generated_tokens
    finally:
        torch.tpu._set_cache_only(False)
    stream = sim.counters() - before
    manager.stop(block=True)
    manager.destroy()
    return [results[i] for i in ids], plan, stream

# A. The kernel path: mixed lengths, prefill chunks and decodes in the same steps.
model = tiny_model("qwen3", seed=0, head_dim=128)
check_context_sensitive(model)
lengths, news = [1, 90, 9, 40, 20], [5, 3, 5, 4, 5]
ps = prompts(model, lengths)
ref = reference(model, ps, news)
model.to("tpu")
got, plan, stream = serve(model, ps, news)
stats = plan.stats.asdict()
r["kernel"] = dict(
    attention=plan.attention, match=got == ref, stream_programs=stream.programs,
    calls=simulated_pallas.STATS.calls, layers=model.config.num_hidden_layers, steps=stats["steps"],
    # the simulator's count of what the kernel read, and the plugin's (per layer) count of the same
    simulated_read=simulated_pallas.STATS.kv_bytes_read, planned_read=stats["kv_bytes_read"],
    decode_ratio=stats["decode_kv_read_over_held"], page_size=plan.page_size, max_len=plan.max_len,
)

# B. The same requests with the present plain-PyTorch paged attention: same tokens, max_len gathers.
serving.configure(attention="paged")
got, plan, stream = serve(model, ps, news)
r["present"] = dict(attention=plan.attention, match=got == ref, calls=simulated_pallas.STATS.calls,
                    decode_ratio=plan.stats.asdict()["decode_kv_read_over_held"])
serving.reset()

# C. A sliding-window model (window 8, prompts past it): the window goes to the kernel.
mistral = tiny_model("mistral", seed=0, head_dim=128)
check_context_sensitive(mistral)
ps_c, news_c = prompts(mistral, [3, 20], seed=1), [3, 3]
ref_c = reference(mistral, ps_c, news_c)
mistral.to("tpu")
got, plan, _ = serve(mistral, ps_c, news_c)
r["sliding"] = dict(attention=plan.attention, match=got == ref_c)

# D. What the kernel cannot take: the present path, said once, with its reason.
class Said(logging.Handler):
    def __init__(self):
        super().__init__()
        self.messages = []
    def emit(self, record):
        self.messages.append(record.getMessage())

def attention_of(model):
    said = Said()
    logging.getLogger("transformers_tpu_ext").addHandler(said)
    try:
        manager = model.init_continuous_batching(generation_config=gc)
    finally:
        logging.getLogger("transformers_tpu_ext").removeHandler(said)
    plan = manager.continuous_batching_config.tpu_plan
    manager.destroy()
    return plan.attention, [m for m in said.messages if "paged attention" in m]

sys.modules["jax.experimental.pallas.ops.tpu.ragged_paged_attention"] = None  # a JAX without the kernel
r["no_kernel"] = attention_of(tiny_model("qwen3", seed=1, head_dim=128).to("tpu"))
report(r)
