"""Quantized models on the simulated TPU, against the same quantized model on the CPU.

One fresh interpreter loads context-sensitive tiny models (float32: the simulator matches the CPU bit for
bit there) and reports what a user would see:

- int8 weight-only (torchao ``Int8WeightOnlyConfig``): where the weights are and in what, bytes, tokens of
  ``generate()`` and of continuous batching, programs compiled against the unquantized model's, placement
  under a budget that holds the int8 model only, the bytes the serving cache budget subtracts;
- FineGrainedFP8 checkpoints (:func:`~transformers_tpu_ext.testing.tiny.save_tiny_fp8_model`): kept float8 on
  the TPU, tokens equal to the CPU model loaded with ``dequantize=True``, on-the-fly quantization, offload,
  the messages of the loads that cannot stay 8-bit;
- ``load_in_8bit`` / ``load_in_4bit``: one message naming the TPU alternative.

A second interpreter with the quantization patches disabled shows the FP8 and bitsandbytes facts come
from them (upstream: FP8 dequantized to bf16, bitsandbytes' own import error).
"""

from __future__ import annotations

import pytest

from _subprocess import run_python

pytest.importorskip("torchao")

SCRIPT = r"""
import logging, os, tempfile, warnings
warnings.filterwarnings("ignore")
import torch
from transformers import AutoModelForCausalLM, BitsAndBytesConfig, FineGrainedFP8Config, GenerationConfig, TorchAoConfig
from torchao.quantization import Int8WeightOnlyConfig
from transformers_tpu_ext import testing
from transformers_tpu_ext.quantization.runtime import tensor_leaves
from transformers_tpu_ext.testing.tiny import check_context_sensitive, save_tiny_fp8_model, save_tiny_model

sim = testing.install(chips=1, hbm_bytes="256MiB")
FULL = os.environ.get("MODE") != "disabled"
tmp = tempfile.mkdtemp()
r = {}
gen = torch.Generator().manual_seed(0)
plain = str(save_tiny_model(tmp + "/llama", "llama"))
fp8 = str(save_tiny_fp8_model(tmp + "/llama-fp8", "llama"))
ids = torch.randint(2, 300, (2, 12), generator=gen)
mask = torch.ones_like(ids)
ids[1, :5] = 0  # left padding on the second row
mask[1, :5] = 0
F32 = dict(dtype=torch.float32)

def int8():
    return TorchAoConfig(Int8WeightOnlyConfig())

def tokens(model):
    dev = model.device
    return model.generate(ids.to(dev), attention_mask=mask.to(dev), max_new_tokens=10, do_sample=False).cpu().tolist()

def logits(model):
    with torch.no_grad():
        return model(ids.to(model.device), attention_mask=mask.to(model.device)).logits.cpu()

def decoder_linear_bytes(model, on_tpu=True):
    # Bytes of the decoder layers' linear weights (and their scales), by the tensors holding them.
    total = 0
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.Linear) and ".layers." in name:
            for p in module.parameters(recurse=False):
                for leaf in tensor_leaves(p):
                    if (leaf.device.type == "tpu") == on_tpu:
                        total += leaf.numel() * leaf.element_size()
    return total

def bf16_linear_bytes(model):
    return sum(2 * m.weight.numel() for n, m in model.named_modules() if isinstance(m, torch.nn.Linear) and ".layers." in n)

def first_and_second(model):
    torch._dynamo.reset()
    sim.reset_counters()  # every model counts its programs from scratch (eager signatures included)
    before = sim.counters(); first = tokens(model); one = (sim.counters() - before).asdict()
    before = sim.counters(); tokens(model); two = (sim.counters() - before).asdict()
    return first, one, two

def where(model):
    q = model.model.layers[0].self_attn.q_proj
    w = q.weight
    return [type(q).__name__, type(w).__name__, str(w.dtype), str(w.device),
            sorted({str(leaf.dtype) for leaf in tensor_leaves(w)})]

def places(model):
    device_map = getattr(model, "hf_device_map", None) or {"": model.device}
    return sorted({"tpu" if str(v) in ("0", "tpu", "tpu:0") else str(v) for v in device_map.values()})

def error(fn):
    try:
        fn()
        return None
    except Exception as e:
        return f"{type(e).__name__}: {e}"

# ---- CPU references (the process sees no TPU)
with sim.hidden():
    cpu_plain = AutoModelForCausalLM.from_pretrained(plain, **F32)
    check_context_sensitive(cpu_plain)
    cpu_int8 = AutoModelForCausalLM.from_pretrained(plain, quantization_config=int8(), **F32)
    cpu_fp8 = AutoModelForCausalLM.from_pretrained(fp8, quantization_config=FineGrainedFP8Config(dequantize=True), **F32)
    ref = {"plain": tokens(cpu_plain), "int8": tokens(cpu_int8), "fp8": tokens(cpu_fp8)}
    ref_logits = {"plain": logits(cpu_plain), "int8": logits(cpu_int8), "fp8": logits(cpu_fp8)}
    r["cpu_fp8_is_plain_linear"] = type(cpu_fp8.model.layers[0].self_attn.q_proj).__name__ == "Linear"
    r["logits_differ"] = {k: float((ref_logits[k] - ref_logits["plain"]).abs().max()) for k in ("int8", "fp8")}
    r["bnb_off_tpu"] = error(lambda: AutoModelForCausalLM.from_pretrained(
        plain, quantization_config=BitsAndBytesConfig(load_in_8bit=True), device_map="auto"))

# ---- FP8 on the TPU
def fp8_tpu():
    model = AutoModelForCausalLM.from_pretrained(fp8, device_map="auto", **F32)
    first, one, two = first_and_second(model)
    r["fp8"] = dict(where=where(model), match=first == ref["fp8"], programs=one, second=two,
                    bytes=decoder_linear_bytes(model), bf16=bf16_linear_bytes(model),
                    logits=float((logits(model) - ref_logits["fp8"]).abs().max()))
    del model

fp8_tpu()
torch._dynamo.reset()
r["fp8_no_device_map"] = where(AutoModelForCausalLM.from_pretrained(fp8, **F32))
r["bnb"] = {
    "8bit": error(lambda: AutoModelForCausalLM.from_pretrained(plain, quantization_config=BitsAndBytesConfig(load_in_8bit=True), device_map="auto")),
    "4bit": error(lambda: AutoModelForCausalLM.from_pretrained(plain, quantization_config=BitsAndBytesConfig(load_in_4bit=True))),
    "host": error(lambda: AutoModelForCausalLM.from_pretrained(plain, quantization_config=BitsAndBytesConfig(load_in_8bit=True), device_map="cpu")),
}
if not FULL:
    report(r); raise SystemExit

# ---- The unquantized model on the TPU: programs and bytes to compare with
torch._dynamo.reset()
model = AutoModelForCausalLM.from_pretrained(plain, device_map="auto", **F32)
first, one, two = first_and_second(model)
r["plain"] = dict(match=first == ref["plain"], programs=one, second=two)
from transformers_tpu_ext.serving.patch_continuous_batching import _resident_bytes
plain_resident = _resident_bytes(model)
del model

# ---- int8 on the TPU
torch._dynamo.reset()
model = AutoModelForCausalLM.from_pretrained(plain, device_map="auto", quantization_config=int8(), **F32)
first, one, two = first_and_second(model)
truth = sum(leaf.numel() * leaf.element_size() for t in [*model.parameters(), *model.buffers()]
            for leaf in tensor_leaves(t) if leaf.device.type == "tpu")
r["int8"] = dict(where=where(model), match=first == ref["int8"], programs=one, second=two,
                 bytes=decoder_linear_bytes(model), bf16=bf16_linear_bytes(model),
                 logits=float((logits(model) - ref_logits["int8"]).abs().max()),
                 resident=_resident_bytes(model), resident_truth=truth, plain_resident=plain_resident)

# Continuous batching: per-request tokens of the quantized CPU model, the cache budget from the true bytes.
gc = GenerationConfig(do_sample=False, eos_token_id=1, pad_token_id=0)
ps = [torch.randint(2, 300, (n,), generator=gen).tolist() for n in (3, 21, 9)]
with sim.hidden():
    cb_ref = [cpu_int8.generate(torch.tensor([p]), max_new_tokens=5, min_new_tokens=5, do_sample=False)[0, len(p):].tolist() for p in ps]
manager = model.init_continuous_batching(generation_config=gc)
plan = manager.continuous_batching_config.tpu_plan
manager.destroy()
got = model.generate_batch(ps, generation_config=gc, max_new_tokens=5, min_new_tokens=5)
r["int8_cb"] = dict(match=[o.generated_tokens for o in got.values()] == cb_ref, resident=plan.resident_bytes)
del model

# Placement: a budget that holds the int8 model but not the unquantized one.
budget = (r["int8"]["resident"] / 0.9 + plain_resident) // 2
placed = {}
for name, kwargs in (("int8", dict(quantization_config=int8())), ("plain", {})):
    m = AutoModelForCausalLM.from_pretrained(plain, device_map="auto", max_memory={"tpu": int(budget), "cpu": 10**9}, **F32, **kwargs)
    placed[name] = places(m)
r["placement"] = dict(budget=budget, placed=placed)

# ---- FP8: on-the-fly quantization at load, offload, the loads that cannot stay 8-bit
torch._dynamo.reset()
otf = AutoModelForCausalLM.from_pretrained(plain, device_map="auto", quantization_config=FineGrainedFP8Config(weight_block_size=[16, 16]), **F32)
ck = AutoModelForCausalLM.from_pretrained(fp8, device_map="auto", **F32)
pairs = [(a, b) for (n, a), (_, b) in zip(otf.named_parameters(), ck.named_parameters())]
r["fp8_on_the_fly"] = dict(where=where(otf), same_as_checkpoint=all(
    torch.equal(a.cpu().view(torch.uint8) if a.dtype == torch.float8_e4m3fn else a.cpu(),
                b.cpu().view(torch.uint8) if b.dtype == torch.float8_e4m3fn else b.cpu()) for a, b in pairs))
del otf, ck
off = AutoModelForCausalLM.from_pretrained(fp8, device_map="auto", max_memory={"tpu": 100000, "cpu": 10**9}, **F32)
r["fp8_offload"] = dict(map=places(off), match=tokens(off) == ref["fp8"])
del off
r["fp8_all_on_host"] = error(lambda: AutoModelForCausalLM.from_pretrained(fp8, device_map="auto", max_memory={"tpu": 1000, "cpu": 10**9}, **F32))
r["fp8_dequantize"] = where(AutoModelForCausalLM.from_pretrained(fp8, device_map="auto", quantization_config=FineGrainedFP8Config(dequantize=True), **F32))

# ---- deactivate() restores the originals
import transformers_tpu_ext
from transformers.integrations import finegrained_fp8
from transformers.quantizers import auto
transformers_tpu_ext.deactivate()
r["reverted"] = not getattr(finegrained_fp8.fp8_linear, "_tpu_ext", False) and not hasattr(
    auto.FineGrainedFP8HfQuantizer.validate_environment, "__wrapped__")
transformers_tpu_ext.activate()
r["reapplied"] = getattr(finegrained_fp8.fp8_linear, "_tpu_ext", False)
report(r)
"""


#: Small serving ladders (two step shapes) keep the continuous-batching warm-up short.
ENV = {"TRANSFORMERS_TPU_EXT_SERVE_MAX_BATCH_TOKENS": "32", "TRANSFORMERS_TPU_EXT_SERVE_MAX_REQUESTS": "8"}


@pytest.fixture(scope="module")
def seen():
    return run_python(SCRIPT, env=ENV, timeout=900)[0]


@pytest.fixture(scope="module")
def disabled():
    env = {"MODE": "disabled", "TRANSFORMERS_TPU_EXT_DISABLE": "quantizers,finegrained_fp8"}
    return run_python(SCRIPT, env=env, timeout=900)[0]


def test_the_references_are_quantized_and_context_sensitive(seen):
    # The int8 and FP8 models compute other logits than the unquantized one: their tokens prove the quantized path.
    assert seen["logits_differ"]["int8"] > 1e-3 and seen["logits_differ"]["fp8"] > 1e-3
    assert seen["cpu_fp8_is_plain_linear"]


def test_int8_weights_stay_int8_on_the_tpu_and_give_the_cpu_tokens(seen):
    int8 = seen["int8"]
    assert int8["where"] == ["Linear", "Int8Tensor", "torch.float32", "tpu:0", ["torch.float32", "torch.int8"]]
    assert int8["match"]
    # Eager logits: the simulator's attention is decomposed (not the CPU's fused kernel); far closer than int8's change.
    assert int8["logits"] < 1e-4 < 1e-2 < seen["logits_differ"]["int8"]
    assert int8["bytes"] <= 0.6 * int8["bf16"]


def test_int8_compiles_no_more_programs_than_the_unquantized_model(seen):
    plain, int8 = seen["plain"], seen["int8"]
    assert plain["match"]
    assert int8["programs"]["graphs_compiled"] <= plain["programs"]["graphs_compiled"]
    assert int8["programs"]["eager_programs"] <= plain["programs"]["eager_programs"]
    assert int8["second"]["graphs_compiled"] == int8["second"]["eager_programs"] == 0


def test_placement_counts_quantized_bytes(seen):
    placed = seen["placement"]["placed"]
    assert placed["int8"] == ["tpu"]  # wholly on the TPU
    assert "cpu" in placed["plain"]  # the unquantized model offloads under the same budget


def test_serving_budget_counts_the_inner_tensors_of_quantized_weights(seen):
    int8 = seen["int8"]
    # torchao's wrappers report data_ptr() 0 and their outer dtype: counted by their inner tensors, each once.
    assert int8["resident"] == int8["resident_truth"]
    assert int8["resident"] < int8["plain_resident"]
    assert seen["int8_cb"]["resident"] == int8["resident"]


def test_int8_continuous_batching_matches_per_request_generate(seen):
    assert seen["int8_cb"]["match"]


def test_fp8_checkpoint_stays_8bit_and_matches_the_dequantized_cpu_model(seen):
    fp8 = seen["fp8"]
    assert fp8["where"] == ["FP8Linear", "TpuTensor", "torch.float8_e4m3fn", "tpu:0", ["torch.float8_e4m3fn"]]
    assert fp8["match"]
    assert fp8["logits"] < 1e-4 < 1e-2 < seen["logits_differ"]["fp8"]
    assert fp8["bytes"] <= 0.6 * fp8["bf16"]
    assert fp8["programs"]["graphs_compiled"] <= seen["plain"]["programs"]["graphs_compiled"]
    assert fp8["programs"]["eager_programs"] <= seen["plain"]["programs"]["eager_programs"]
    assert fp8["second"]["graphs_compiled"] == fp8["second"]["eager_programs"] == 0


def test_fp8_on_the_fly_and_offload(seen):
    assert seen["fp8_on_the_fly"]["where"][0] == "FP8Linear" and seen["fp8_on_the_fly"]["where"][3] == "tpu:0"
    assert seen["fp8_on_the_fly"]["same_as_checkpoint"]  # Transformers' quantization, bit for bit
    assert seen["fp8_offload"]["map"] == ["cpu", "tpu"] and seen["fp8_offload"]["match"]


def test_fp8_loads_that_cannot_stay_8bit(seen):
    assert seen["fp8_no_device_map"][:4] == ["Linear", "Parameter", "torch.float32", "cpu"]  # upstream's rule
    assert seen["fp8_dequantize"][:4] == ["Linear", "TpuTensor", "torch.float32", "tpu:0"]  # as asked
    message = seen["fp8_all_on_host"]
    assert message.startswith("ValueError: FP8 weights were kept 8-bit for the TPU") and "dequantize=True" in message


def test_bitsandbytes_on_a_tpu_is_one_message_naming_the_alternative(seen):
    for key in ("8bit", "4bit"):
        message = seen["bnb"][key]
        assert message.startswith(f"ValueError: bitsandbytes (load_in_{key}) has no TPU backend")
        assert "TorchAoConfig(Int8WeightOnlyConfig())" in message
    # On the host, and without a TPU, upstream's own check runs (bitsandbytes is not installed here).
    assert "requires bitsandbytes" in seen["bnb"]["host"] or seen["bnb"]["host"] is None
    assert "requires bitsandbytes" in seen["bnb_off_tpu"] or seen["bnb_off_tpu"] is None


def test_deactivate_restores_the_originals(seen):
    assert seen["reverted"] and seen["reapplied"]


def test_without_the_patches_fp8_is_dequantized_and_bitsandbytes_fails_its_own_way(disabled):
    assert disabled["fp8"]["where"][:3] == ["Linear", "TpuTensor", "torch.float32"]  # 2x (here 4x) the bytes
    assert disabled["fp8"]["bytes"] > disabled["fp8"]["bf16"]
    assert "has no TPU backend" not in (disabled["bnb"]["8bit"] or "")
