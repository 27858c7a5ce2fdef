"""Issue 29: Ctrl-C (or any error) inside ``generate_batch()`` on TPU gives the model its attention back.

docs/serving.md promises that stopping gives the user's attention back; a ``KeyboardInterrupt``
during the manager's warm-up (before upstream's ``try``), or while it stops, used to leave the model
with ``config._attn_implementation == "tpu_paged|sdpa"``. One fresh interpreter on the simulated TPU
interrupts a batch at three places and reads the attribute after each.
"""

from __future__ import annotations

import pytest

from _subprocess import run_python

SCRIPT = r"""
import torch
from transformers import GenerationConfig
from transformers.generation.continuous_batching import continuous_api
from transformers_tpu_ext import testing
from transformers_tpu_ext.testing.tiny import tiny_model

testing.install(chips=1, hbm_bytes="128MiB")
model = tiny_model("qwen3").to("tpu")
gc = GenerationConfig(do_sample=False, eos_token_id=1, pad_token_id=0, max_new_tokens=3)
prompts = [[5, 6, 7], [8, 9, 10, 11]]
Manager = continuous_api.ContinuousBatchingManager
r = {"before": model.config._attn_implementation}

def interrupted(name, error, after=0):
    original = getattr(Manager, name)
    calls = []
    def raising(self, *args, **kwargs):
        calls.append(model.config._attn_implementation)
        if len(calls) > after:
            raise error
        return original(self, *args, **kwargs)
    setattr(Manager, name, raising)
    try:
        model.generate_batch(prompts, generation_config=gc, warmup=(name == "warmup"))
        raised = None
    except BaseException as e:
        raised = type(e).__name__
    finally:
        setattr(Manager, name, original)
    return dict(raised=raised, during=calls[-1] if calls else None, after=model.config._attn_implementation)

r["warmup"] = interrupted("warmup", KeyboardInterrupt())
r["get_result"] = interrupted("get_result", KeyboardInterrupt(), after=1)
r["add_requests"] = interrupted("add_requests", RuntimeError("boom"))
out = model.generate_batch(prompts, generation_config=gc, warmup=False)
r["after_clean_run"] = dict(results=len(out), after=model.config._attn_implementation)
report(r)
"""


@pytest.mark.slow  # a fresh interpreter: 12 CPU-s, ~25 s on 2 busy cores
def test_an_interrupted_generate_batch_gives_the_model_its_attention_back():
    r, err = run_python(SCRIPT, env={"TRANSFORMERS_TPU_EXT_SERVE_MAX_BATCH_TOKENS": "16",
                                     "TRANSFORMERS_TPU_EXT_SERVE_MAX_REQUESTS": "8",
                                     "TRANSFORMERS_TPU_EXT_SERVE_WARMUP": "0"})
    assert r["before"] == "sdpa", r
    for case in ("warmup", "get_result"):
        assert r[case]["raised"] == "KeyboardInterrupt", (case, r, err[-3000:])
        assert r[case]["during"].startswith("tpu_paged|"), (case, r)  # the manager's steps had the TPU attention
        assert r[case]["after"] == "sdpa", (case, r)
    # upstream logs an Exception inside the batch and returns what finished; the attention is back too
    assert r["add_requests"]["after"] == "sdpa", r
    assert r["after_clean_run"] == {"results": 2, "after": "sdpa"}, r
