"""Worker of test_qlora.py: runs in a fresh interpreter (tests/_subprocess.run_python) and reports one JSON value."""
from _worker import report
import os, sys, warnings
warnings.filterwarnings("ignore")
import torch
from transformers_tpu_ext import testing

where, base_kind, shared = os.environ["WHERE"], os.environ["BASE"], os.environ["SHARED"]
sim = testing.install(chips=1)
if where == "cpu":
    sim.park()  # this process sees no TPU: plain upstream training on the CPU
from peft import LoraConfig, PeftModel, get_peft_model
from torchao.quantization import Int8WeightOnlyConfig
from transformers import AutoModelForCausalLM, DataCollatorForLanguageModeling, FineGrainedFP8Config, TorchAoConfig, Trainer, TrainingArguments
from transformers_tpu_ext.quantization.runtime import tensor_leaves
from transformers_tpu_ext.testing.tiny import save_tiny_fp8_model, save_tiny_model, tiny_lm_dataset, tiny_tokenizer

plain, fp8 = shared + "/llama", shared + "/llama-fp8"
if not os.path.exists(plain + "/config.json"):
    save_tiny_model(plain, "llama")
    save_tiny_fp8_model(fp8, "llama")
F32 = dict(dtype=torch.float32)

def load_base():
    device_map = "auto" if where == "tpu" else None
    if base_kind == "int8":
        return AutoModelForCausalLM.from_pretrained(plain, quantization_config=TorchAoConfig(Int8WeightOnlyConfig()), device_map=device_map, **F32)
    if where == "cpu":
        return AutoModelForCausalLM.from_pretrained(fp8, quantization_config=FineGrainedFP8Config(dequantize=True), **F32)
    return AutoModelForCausalLM.from_pretrained(fp8, device_map=device_map, **F32)

initial = f"{shared}/initial-adapter"
if not os.path.exists(initial + "/adapter_config.json"):
    lora = LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, task_type="CAUSAL_LM", init_lora_weights="gaussian",
                      target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"])
    torch.manual_seed(0)
    get_peft_model(AutoModelForCausalLM.from_pretrained(plain, **F32), lora).save_pretrained(initial)

base = load_base()
model = PeftModel.from_pretrained(base, initial, is_trainable=True)
lora_layer = base.model.layers[0].self_attn.q_proj
q = lora_layer.base_layer
r = {"lora_layer": type(lora_layer).__name__, "base": [type(q).__name__, type(q.weight).__name__, sorted({str(l.dtype) for l in tensor_leaves(q.weight)}), str(q.weight.device)]}
tok = tiny_tokenizer()
tok.padding_side = "right"
args = TrainingArguments(output_dir=shared + f"/out-{where}-{base_kind}", per_device_train_batch_size=4, max_steps=6,
                         logging_steps=1, report_to=[], learning_rate=5e-3, save_strategy="no", seed=0,
                         disable_tqdm=True, use_cpu=where == "cpu")
trainer = Trainer(model=model, args=args, train_dataset=tiny_lm_dataset(num_examples=24, max_length=40),
                  data_collator=DataCollatorForLanguageModeling(tok, mlm=False))
trainer.train()
r["losses"] = [h["loss"] for h in trainer.state.log_history if "loss" in h]
lora_a = model.base_model.model.model.layers[0].self_attn.q_proj.lora_A["default"].weight
r["lora_device"] = str(lora_a.device)
r["base_after"] = [sorted({str(l.dtype) for l in tensor_leaves(q.weight)}), str(q.weight.device)]
adapter = shared + f"/adapter-{where}-{base_kind}"
model.save_pretrained(adapter)
ids = torch.tensor([[5, 17, 42, 9, 88, 5, 61]])
model.eval()
with torch.no_grad():
    trained = model(input_ids=ids.to(base.device)).logits.cpu()
    reloaded = PeftModel.from_pretrained(load_base(), adapter)
    again = reloaded(input_ids=ids.to(reloaded.device)).logits.cpu()
r["reload_equal"] = bool(torch.equal(trained, again))
r["adapter_files"] = sorted(os.listdir(adapter))
report(r)
