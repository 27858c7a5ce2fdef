"""Worker of test_serving.py: runs in a fresh interpreter (tests/_subprocess.run_python) and reports one JSON value."""
from _worker import report
import json, logging, os, tempfile, warnings
import torch
from transformers import CompileConfig, ContinuousBatchingConfig, GenerationConfig
from transformers_tpu_ext import testing
from transformers_tpu_ext.testing.tiny import check_context_sensitive, save_tiny_model, tiny_model, tiny_tokenizer

sim = testing.install(chips=1, hbm_bytes="128MiB")
full = os.environ.get("MODE") != "disabled"
gen = torch.Generator().manual_seed(0)
gc = GenerationConfig(do_sample=False, eos_token_id=1, pad_token_id=0)
r = {}

def prompts(model, lengths):
    return [torch.randint(2, model.config.vocab_size, (n,), generator=gen).tolist() for n in lengths]

def reference(model, ps, news):
    return [model.generate(torch.tensor([p]), max_new_tokens=n, min_new_tokens=n, do_sample=False)[0, len(p):].tolist()
            for p, n in zip(ps, news)]

def drain(manager, ids):
    results = {}
    while len(results) < len(ids):
        out = manager.get_result(timeout=30)
        assert out is not None, "no result"
        if out.is_finished():
            results[out.request_id] = out.generated_tokens
    return [results[i] for i in ids]

# A. The manager: warm-up, then a mixed stream (prompts 1..70 tokens: chunked past 32; 1..8 new tokens).
model = tiny_model("qwen3")
check_context_sensitive(model)
lengths, news = [1, 70, 9, 33, 16, 2, 48, 25, 5, 40], [8, 1, 5, 3, 8, 2, 6, 4, 7, 1]
ps = prompts(model, lengths)
if not full:  # plain Transformers runs eagerly (slowly): a few requests show it
    lengths, news = lengths[:4], news[:4]
    ps = ps[:4]
ref = reference(model, ps, news)
model.to("tpu")
# Unpatched, the cache would be sized from host RAM (90 % of it): give it a size.
manager = model.init_continuous_batching(
    generation_config=gc, continuous_batching_config=None if full else ContinuousBatchingConfig(num_blocks=64)
)
config = manager.continuous_batching_config
plan = getattr(config, "tpu_plan", None)
before = sim.counters()
manager.warmup()
warm = sim.counters() - before
manager.start()
before = sim.counters()
ids = [manager.add_request(p, max_new_tokens=n) for p, n in zip(ps, news)]
out = drain(manager, ids)
stream = sim.counters() - before
processor = manager.batch_processor
cache_bytes = processor.cache.cache_tensor.numel() * processor.cache.cache_tensor.element_size()
r["A"] = dict(
    match=out == ref, planned=plan is not None, warmup_graphs=warm.graphs_compiled,
    shapes=len(plan.shapes) if plan else None, stream_programs=stream.programs,
    compute_stream=processor.inputs_and_outputs.compute_stream is None, async_batching=config.use_async_batching,
    backend=getattr(config.varlen_compile_config, "backend", None),
    attention_during=model.config._attn_implementation, cache_bytes=cache_bytes,
    plan=plan.asdict() if plan else None, hbm=torch.tpu.get_device_properties().total_memory,
)
manager.stop(block=True)
manager.destroy()
r["A"]["attention_after"] = model.config._attn_implementation
if not full:
    report(r); raise SystemExit

# B. generate_batch with a sliding-window model (window 8, prompts past it), twice.
mistral = tiny_model("mistral")
check_context_sensitive(mistral)
ps_b = prompts(mistral, [3, 30, 12, 21])
ref_b = reference(mistral, ps_b, [6] * 4)
mistral.to("tpu")
calls = []
for _ in range(2):
    before = sim.counters()
    got = mistral.generate_batch(ps_b, generation_config=gc, max_new_tokens=6)
    calls.append(dict(match=[o.generated_tokens for o in got.values()] == ref_b, graphs=(sim.counters() - before).graphs_compiled))
r["B"] = calls

# C. Mistakes and adaptations, raised or said before anything runs.
manager = model.init_continuous_batching(generation_config=gc)
try:
    manager.add_request([5] * 600, max_new_tokens=4)
    r["too_long"] = None
except ValueError as error:
    r["too_long"] = str(error)
manager.destroy()
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    manager = model.init_continuous_batching(
        generation_config=gc,
        continuous_batching_config=ContinuousBatchingConfig(varlen_compile_config=CompileConfig(), use_async_batching=True),
    )
adapted = manager.continuous_batching_config
r["compile_config"] = dict(warnings=[str(w.message) for w in caught if "CompileConfig" in str(w.message)],
                           backend=adapted.varlen_compile_config.backend, mode=adapted.varlen_compile_config.mode,
                           async_batching=adapted.use_async_batching)
manager.destroy()

# D. Off TPU nothing changes: a CPU model next to a TPU, and a process that sees no TPU. (A fixed
# num_blocks: on CPU, upstream sizes the cache from 60 % of host RAM.)
cpu_model = tiny_model("qwen3")
small = ContinuousBatchingConfig(num_blocks=16)
off = {}
for name, context in (("cpu_model", torch.no_grad()), ("hidden", sim.hidden())):
    with context:
        m = cpu_model.init_continuous_batching(generation_config=gc, continuous_batching_config=small)
        off[name] = dict(planned=hasattr(m.continuous_batching_config, "tpu_plan"),
                         attention=cpu_model.config._attn_implementation)
        m.destroy()
        got = cpu_model.generate_batch(ps[:3], generation_config=gc, max_new_tokens=5, continuous_batching_config=small)
        off[name]["match"] = [o.generated_tokens for o in got.values()] == reference(cpu_model, ps[:3], [5] * 3)
r["off_tpu"] = off

# E. transformers serve --continuous-batching on the TPU host, as a user runs it: the command in a process of its own
# (Transformers 5.25 runs the model in a spawned one), counted there (TRANSFORMERS_TPU_EXT_SIMULATE_REPORT).
from _serve_cli import Served
path = save_tiny_model(tempfile.mkdtemp() + "/tiny", "qwen3")
tok = tiny_tokenizer()
from transformers import AutoModelForCausalLM
cpu_ref = AutoModelForCausalLM.from_pretrained(path)
texts = ["The secret to baking a good cake is", "Static shapes avoid recompilation"]
expected = []
for text in texts:
    ids_t = tok(text, return_tensors="pt").input_ids
    expected.append(tok.decode(cpu_ref.generate(ids_t, max_new_tokens=8, do_sample=False)[0, ids_t.shape[1]:], skip_special_tokens=True))
with Served(str(path)) as server:
    answers, programs = [], []
    loaded = server.programs()  # Transformers 5.25 starts (and warms up) the manager with the model; 5.24 at the first request
    for text in texts:
        before = server.programs()
        status, payload = server.call("POST", "/v1/completions", {"prompt": text, "max_tokens": 8, "temperature": 0})
        answers.append(payload["choices"][0]["text"] if status == 200 else [status, payload])
        programs.append(server.programs() - before)
    engine = server.engine()
r["serve"] = dict(match=answers == expected, programs=programs, answers=answers, loaded_programs=loaded, engine_process=engine["process"],
                  engine_patch=engine["patches"].get("continuous_batching"), engine_pid_is_own=engine["pid"] == os.getpid())

# F. deactivate() restores every original; activate() re-applies.
import transformers_tpu_ext
from transformers.generation.continuous_batching import cache as cache_module, continuous_api, input_outputs
transformers_tpu_ext.deactivate()
r["reverted"] = (
    continuous_api.ContinuousBatchingIOs is input_outputs.ContinuousBatchingIOs
    and not hasattr(continuous_api.ContinuousBatchingIOs, "_self_wrapper")
    and not hasattr(continuous_api.ContinuousBatchingManager.__init__, "__wrapped__")
    and not hasattr(cache_module.group_layers_by_attn_type, "__wrapped__")
    and not any(name.startswith("tpu_paged") for name in __import__("transformers").modeling_utils.ALL_ATTENTION_FUNCTIONS._global_mapping)
    and not any(name.startswith("tpu_paged") for name in __import__("transformers").masking_utils.ALL_MASK_ATTENTION_FUNCTIONS._global_mapping)
)
transformers_tpu_ext.activate()
r["reapplied"] = "continuous_batching" in transformers_tpu_ext.active_patches() and hasattr(
    continuous_api.ContinuousBatchingManager.__init__, "__wrapped__")
report(r)
