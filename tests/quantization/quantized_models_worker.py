"""Worker of test_quantized_models.py: runs in a fresh interpreter (tests/_subprocess.run_python) and reports one JSON value."""
from _worker import report
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
