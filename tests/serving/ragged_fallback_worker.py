"""Worker of test_ragged_fallback.py: runs in a fresh interpreter (tests/_subprocess.run_python) and reports one JSON value."""
from _worker import report
import logging
import torch
from transformers import GenerationConfig
from transformers_tpu_ext import testing
from transformers_tpu_ext.serving import policy as serving
from transformers_tpu_ext.testing import pallas as simulated_pallas
from transformers_tpu_ext.testing.tiny import check_context_sensitive, tiny_model

sim = testing.install(chips=1, hbm_bytes="1GiB")
gc = GenerationConfig(do_sample=False, eos_token_id=1, pad_token_id=0)
NEW = 4
r = {}

class Said(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.messages = []
    def emit(self, record):
        self.messages.append(record.getMessage())

def run_batch(manager, ps):
    ids = [manager.add_request(p, max_new_tokens=NEW) for p in ps]
    results = {}
    while len(results) < len(ids):
        out = manager.get_result(timeout=900)
        assert out is not None, "no result"
        if out.is_finished():
            results[out.request_id] = out.generated_tokens if out.error is None else ["error", str(out.error)[:300]]
    return [results[i] for i in ids]

real_lower = simulated_pallas._lower_once

def failing_lower(allowed):
    """torch_tpu's lowering inside the compiled step: the first `allowed` new shapes lower, then every one fails."""
    seen = []
    def lower(name, call, arrays, jax):
        key = tuple((k, tuple(t.shape)) for k, t in arrays.items())
        if key not in seen:
            seen.append(key)
        if seen.index(key) >= allowed:
            raise ValueError(f"{name} does not lower for a TPU v6 lite: forced: Mosaic refuses this block shape")
        return real_lower(name, call, arrays, jax)
    return lower

for name, kv_cache, warm, allowed in (("warmup", None, True, 0), ("serving", None, False, 1), ("serving_int8", "int8", False, 1)):
    model = tiny_model("qwen3", seed=2, head_dim=128, num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
    check_context_sensitive(model)
    gen = torch.Generator().manual_seed(5)
    ps = [torch.randint(2, model.config.vocab_size, (n,), generator=gen).tolist() for n in (5, 17, 30)]
    ref = [model.generate(torch.tensor([p]), max_new_tokens=NEW, min_new_tokens=NEW, do_sample=False)[0, len(p):].tolist() for p in ps]
    model.to("tpu")
    serving.configure(kv_cache=kv_cache, warmup=warm)
    said = Said()
    logging.getLogger("transformers_tpu_ext").addHandler(said)
    try:
        manager = model.init_continuous_batching(generation_config=gc)
        plan = manager.continuous_batching_config.tpu_plan
        chosen = plan.attention  # the kernel passed its check when the manager was made
        simulated_pallas._lower_once = failing_lower(allowed)  # ... and fails in the compiled step
        if warm:
            manager.warmup()
        manager.start()
        got = run_batch(manager, ps)
        simulated_pallas._lower_once = real_lower
        before = sim.counters()
        again = run_batch(manager, ps)
        second = (sim.counters() - before).programs
        manager.stop(block=True)
    finally:
        simulated_pallas._lower_once = real_lower
        serving.reset()
        logging.getLogger("transformers_tpu_ext").removeHandler(said)
    r[name] = dict(chosen=chosen, attention=plan.attention, match=got == ref, again=again == ref, got=got, ref=ref,
                   second_batch_programs=second,
                   warnings=[m for m in said.messages if "kernel failed" in m])
report(r)
