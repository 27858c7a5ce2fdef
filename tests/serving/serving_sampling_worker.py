"""Worker of test_serving_sampling.py: the service process after ``warmup --serve`` (argv[1]: the model);
prints ``@@`` and its JSON answer."""
import json, os, sys, torch
from transformers import AutoModelForCausalLM
from transformers_tpu_ext import testing
from transformers_tpu_ext.cli.warmup import serve_generation_config

sim = testing.simulated_tpu()
path = sys.argv[1]
cpu = AutoModelForCausalLM.from_pretrained(path)
gen = torch.Generator().manual_seed(0)
prompts = [torch.randint(2, 300, (n,), generator=gen).tolist() for n in (5, 12, 3)]
greedy = [cpu.generate(torch.tensor([p]), max_new_tokens=6, min_new_tokens=6, do_sample=False)[0, len(p):].tolist()
          for p in prompts]
model = AutoModelForCausalLM.from_pretrained(path, device_map="auto")
r = {"greedy_differ": len({tuple(g) for g in greedy}) == len(greedy)}

def drain(manager, ids):
    results = {}
    while len(results) < len(ids):
        out = manager.get_result(timeout=120)
        if out is None or out.error is not None:
            raise RuntimeError(f"request failed: {out and out.error}")
        if out.is_finished():
            results[out.request_id] = out.generated_tokens
    return [results[i] for i in ids]

# transformers serve builds its manager from the first request's generation config (here temperature
# 0.8, top_p 0.9; the model's own: 0.6, 0.95) and start() warms it up: it loads what warmup --serve compiled.
first = serve_generation_config(model)
first.temperature, first.top_p, first.max_new_tokens = 0.8, 0.9, 6
first.eos_token_id = None
torch.manual_seed(0)
before = sim.counters()
manager = model.init_continuous_batching(generation_config=first)
manager.start()
started = sim.counters() - before
before = sim.counters()
one, out, r["served_error"] = prompts[0][:1], [[]] * 22, None
try:
    with testing.cache_only("requests of other temperatures, top-p and top-k"):
        sampled = [manager.add_request(p, max_new_tokens=6, temperature=t, top_p=tp)
                   for p, t, tp in zip(prompts, (0.3, 0.9, 1.7), (0.5, 0.9, 1.0))]
        argmax = [manager.add_request(p, max_new_tokens=6, top_k=1, temperature=1.3) for p in prompts]
        cold = [manager.add_request(one, max_new_tokens=1, temperature=0.05, top_k=50, top_p=1.0) for _ in range(8)]
        hot = [manager.add_request(one, max_new_tokens=1, temperature=8.0, top_k=50, top_p=1.0) for _ in range(8)]
        out = drain(manager, sampled + argmax + cold + hot)
except Exception as error:  # reported, not raised: the manager's thread would keep the process alive
    r["served_error"] = repr(error)[:400]
finally:
    manager.stop(block=True, timeout=30)
    manager.destroy()
served = sim.counters() - before
first_token = cpu(torch.tensor([one])).logits[0, -1].argmax().item()
r.update(
    started_compiled=started.graphs_compiled + started.eager_programs, started_loaded=started.programs_loaded,
    served_compiled=served.graphs_compiled + served.eager_programs,
    argmax_is_greedy=out[3:6] == greedy, sampled_lengths=[len(o) for o in out[:3]],
    cold_first=[o[0] if o else None for o in out[6:14]], hot_first=[o[0] if o else None for o in out[14:]],
    greedy_first=first_token,
)
# A first request of temperature=1.0 and top_p=1.0: generate() would have no temperature or top-p
# processor; the plugin adds identity ones, so the programs are the same.
neutral = serve_generation_config(model)
neutral.temperature, neutral.top_p = 1.0, 1.0
before = sim.counters()
manager = model.init_continuous_batching(generation_config=neutral)
r["neutral_error"] = None
try:
    with testing.cache_only("a manager of temperature 1.0 and top_p 1.0"):
        manager.start()
        drain(manager, [manager.add_request(p, max_new_tokens=3, temperature=0.7) for p in prompts])
except Exception as error:
    r["neutral_error"] = repr(error)[:400]
finally:
    manager.stop(block=True, timeout=30)
    manager.destroy()
r["neutral_compiled"] = (sim.counters() - before).graphs_compiled
print("@@" + json.dumps(r), flush=True)
os._exit(0)  # a manager thread left by a failure must not keep the process alive
