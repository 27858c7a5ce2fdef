"""Worker of test_generation.py: runs in a fresh interpreter (tests/_subprocess.run_python) and reports one JSON value."""
from _worker import report
import logging
import torch
from transformers import T5Config, T5ForConditionalGeneration
from transformers_tpu_ext import testing
from transformers_tpu_ext.testing.tiny import tiny_model

sim = testing.install(chips=4)
records = []
class Keep(logging.Handler):
    def emit(self, record): records.append(record.getMessage())
logging.getLogger("transformers_tpu_ext").addHandler(Keep())
r = {}
gen = torch.Generator().manual_seed(0)

# Encoder-decoder, inputs on the TPU.
torch.manual_seed(0)
t5 = T5ForConditionalGeneration(T5Config(
    vocab_size=96, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_decoder_layers=2, num_heads=4,
    decoder_start_token_id=0, pad_token_id=0, eos_token_id=1, initializer_factor=5.0)).eval()
ids = torch.randint(2, 96, (2, 9), generator=gen)
mask = torch.ones_like(ids)
mask[1, 6:] = 0
ref = t5.generate(ids, attention_mask=mask, max_new_tokens=8, min_new_tokens=8, do_sample=False)
t5.to("tpu")
try:
    out = t5.generate(ids.to("tpu"), attention_mask=mask.to("tpu"), max_new_tokens=8, min_new_tokens=8,
                      do_sample=False)
    r["t5"] = dict(device=str(out.device), match=torch.equal(out.cpu(), ref),
                   distinct=len(set(ref[:, 1:].flatten().tolist())))
except Exception as error:
    r["t5"] = dict(error=f"{type(error).__name__}: {error}"[:300])

# Decoder-only, inputs_embeds + attention_mask on the TPU.
model = tiny_model("qwen3", seed=0)
ids = torch.randint(2, model.config.vocab_size, (2, 9), generator=gen)
mask = torch.ones_like(ids)
mask[1, :3] = 0
embeds = model.get_input_embeddings()(ids).detach()
ref = model.generate(inputs_embeds=embeds, attention_mask=mask, max_new_tokens=6, do_sample=False)
model.to("tpu")
try:
    before = sim.counters()
    out = model.generate(inputs_embeds=embeds.to("tpu"), attention_mask=mask.to("tpu"), max_new_tokens=6,
                         do_sample=False)
    delta = sim.counters() - before
    r["embeds"] = dict(device=str(out.device), match=torch.equal(out.cpu(), ref), graphs=delta.graphs_compiled)
except Exception as error:
    r["embeds"] = dict(error=f"{type(error).__name__}: {error}"[:300])

# A user's mistake (generation options set on model.config) surfaces once, as upstream raises it.
records.clear()
model.config.num_beams = 3
try:
    model.generate(ids.to("tpu"), max_new_tokens=2)
    r["user_error"] = dict(error=None)
except Exception as error:
    r["user_error"] = dict(error=type(error).__name__, message=str(error)[:120])
r["user_error"]["falling_back_logged"] = any("falling back" in m for m in records)
report(r)
