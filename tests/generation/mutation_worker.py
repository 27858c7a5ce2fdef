"""Worker of test_generation_mutation.py: runs in a fresh interpreter (tests/_subprocess.run_python) and reports one JSON value."""
from _worker import report
import torch
from transformers_tpu_ext import testing
from transformers_tpu_ext.generation import wrap_generate as generation
from transformers_tpu_ext.testing.tiny import tiny_model

sim = testing.install(chips=4)
r = {}
for name, overrides in (("context_sensitive", {}), ("degenerate", {"initializer_range": 0.02})):
    model = tiny_model("qwen3", seed=0, **overrides)
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(2, model.config.vocab_size, (1, n), generator=gen) for n in (3, 5, 7, 9)]
    refs = [model.generate(p, max_new_tokens=8, do_sample=False) for p in prompts]
    model.to("tpu")
    for broken in (False, True):
        generation._BREAK_PADDING_MASK = broken
        outs = [model.generate(p.to("tpu"), max_new_tokens=8, do_sample=False).cpu() for p in prompts]
        r[f"{name}/{'broken' if broken else 'intact'}"] = sum(torch.equal(a, b) for a, b in zip(outs, refs))
    generation._BREAK_PADDING_MASK = False
report(r)
