"""`transformers-tpu warmup MODEL`: ahead-of-time compilation into the persistent compile cache.

The end-to-end runs use the simulated TPU (``TRANSFORMERS_TPU_EXT_SIMULATE``) with the cache turned on
(``TRANSFORMERS_TPU_EXT_COMPILE_CACHE=<dir>``: the simulator is not on the PCI bus, so it is off by
default): a second warm-up, and then the service's own process, compile nothing.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from transformers_tpu_ext import cli


def _env(**changes: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TRANSFORMERS_TPU_EXT_", "TORCH_TPU_"))}
    env.update(HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false", OMP_NUM_THREADS="1", **changes)
    return env


def _warmup(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "transformers_tpu_ext.cli", "warmup", *args],
                          capture_output=True, text=True, env=env, timeout=900)


@pytest.mark.parametrize(
    "args, message",
    [
        ([], "choose the work"),
        (["--max-prompt-length", "64"], "needs both --max-prompt-length and --max-new-tokens"),
        (["--max-prompt-length", "0", "--max-new-tokens", "4"], "argument --max-prompt-length: expected a whole number >= 1"),
    ],
)
def test_usage_errors_are_one_line(tmp_path, capsys, args, message):
    assert cli.main(["warmup", str(tmp_path), *args]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("transformers-tpu warmup: error: ") and message in lines[0]


def test_batch_sizes_and_a_missing_model_are_refused(tmp_path, capsys):
    assert cli.main(["warmup", str(tmp_path), "--serve", "--batch-sizes", "1,x"]) == 2
    assert "expected a comma list of batch sizes" in capsys.readouterr().err
    assert cli.main(["warmup", str(tmp_path / "nope"), "--serve"]) == 2
    assert "no such directory" in capsys.readouterr().err


@pytest.mark.slow
def test_without_a_tpu_it_says_so(tmp_path):
    from transformers_tpu_ext.testing.tiny import save_tiny_model

    path = save_tiny_model(tmp_path / "tiny")
    proc = _warmup([str(path), "--max-prompt-length", "16", "--max-new-tokens", "2"], _env())
    assert proc.returncode == 1
    assert "no TPU is seen here" in proc.stderr and "TRANSFORMERS_TPU_EXT_SIMULATE=1" in proc.stderr


SERVICE = """
import json, os, sys, torch
from transformers import AutoModelForCausalLM
import transformers_tpu_ext
from transformers_tpu_ext import testing
sim = testing.simulated_tpu()
model = AutoModelForCausalLM.from_pretrained(sys.argv[1], device_map="auto")
transformers_tpu_ext.warmup(model, max_prompt_length=24, max_new_tokens=4, max_batch_size=2)
gen = torch.Generator().manual_seed(0)
# In cache-only mode: a program the process does not hold now (the warm-up loaded them) fails the call.
with testing.cache_only("mixed calls within the warmed-up bounds"):
    for call in range(12):
        batch, length, new = 1 + call % 2, int(torch.randint(1, 25, (1,), generator=gen)), 1 + call % 4
        ids = torch.randint(2, 300, (batch, length), generator=gen)
        model.generate(ids.to(model.device) if call % 3 else ids, max_new_tokens=new)
print("@@" + json.dumps(sim.counters().asdict()))
"""


@pytest.mark.slow
def test_a_second_warmup_and_the_service_after_it_compile_nothing(tmp_path):
    from transformers_tpu_ext.testing.tiny import save_tiny_model

    path = str(save_tiny_model(tmp_path / "tiny"))
    cache = tmp_path / "cache"
    env = _env(TRANSFORMERS_TPU_EXT_SIMULATE="chips=1,hbm=96MiB", TRANSFORMERS_TPU_EXT_COMPILE_CACHE=str(cache),
               TRANSFORMERS_TPU_EXT_SERVE_MAX_BATCH_TOKENS="32", TRANSFORMERS_TPU_EXT_SERVE_MAX_REQUESTS="4")
    args = [path, "--max-prompt-length", "24", "--max-new-tokens", "4", "--max-batch-size", "2", "--serve",
            "--train", "32", "--train-batch-size", "2"]
    first = _warmup([*args, "--json"], env)
    assert first.returncode == 0, first.stderr[-3000:]
    one = json.loads(first.stdout[first.stdout.index("{"):])
    assert one["cache"] == str(cache) and set(one["works"]) == {"generate", "serve", "train"}
    assert one["works"]["train"]["lengths"] == [16, 32] and one["works"]["serve"]["shapes"]
    assert one["programs"]["compiled"] > 0 and one["programs"]["loaded"] == 0
    assert one["cache_entries"] == one["programs"]["compiled"]
    assert "warming up training buckets" in first.stderr  # the progress bars

    second = _warmup(args, env)
    assert second.returncode == 0, second.stderr[-3000:]
    summary = second.stdout.strip().splitlines()[-1]
    assert summary.startswith("warmup done in ")
    assert f"0 programs compiled, {one['programs']['compiled']} loaded from the cache; cache {cache}" in summary

    service = subprocess.run([sys.executable, "-c", textwrap.dedent(SERVICE), path], capture_output=True, text=True,
                             env=env, timeout=900)
    assert service.returncode == 0, service.stderr[-3000:]
    counters = json.loads(service.stdout.split("@@", 1)[1])
    assert counters["graphs_compiled"] + counters["eager_programs"] == 0 and counters["programs_loaded"] > 0


def test_infer_options_are_checked_before_loading(tmp_path, capsys):
    for args, message in (
        (["--task", "fill-mask", "--serve"], "--task applies to --infer MAX_LENGTH"),
        (["--infer", "64", "--task", "summarization"], "is not a pipeline --infer warms up"),
        (["--infer", "64", "--serve"], "a command of its own"),
        (["--infer", "0"], "argument --infer: expected a whole number >= 1"),
    ):
        assert cli.main(["warmup", str(tmp_path), *args]) == 2
        lines = capsys.readouterr().err.strip().splitlines()
        assert len(lines) == 1 and message in lines[0], lines


PIPELINE_SERVICE = """
import json, sys, torch
from transformers import pipeline
import transformers_tpu_ext
from transformers_tpu_ext import testing
from transformers_tpu_ext.testing.tiny_encoders import random_texts
sim = testing.simulated_tpu()
pipe = pipeline("text-classification", model=sys.argv[1], device="tpu")
transformers_tpu_ext.warmup(pipe, work="infer", max_length=48, max_batch_size=8)   # loads every bucket
before = sim.counters()
with testing.cache_only("100 texts after the warm-up"):
    pipe(random_texts(100, seed=9, longest=30), batch_size=8)
delta = sim.counters() - before
print("@@" + json.dumps({"total": sim.counters().asdict(), "steady": delta.asdict()}))
"""


@pytest.mark.slow
def test_infer_warmup_then_a_fresh_pipeline_process_compiles_nothing(tmp_path):
    from transformers_tpu_ext.testing.tiny_encoders import tiny_bert_tokenizer, tiny_encoder

    path = tmp_path / "bert"
    tiny_encoder("sequence_classification").save_pretrained(path)
    tiny_bert_tokenizer().save_pretrained(path)
    cache = tmp_path / "cache"
    env = _env(TRANSFORMERS_TPU_EXT_SIMULATE="chips=1,hbm=96MiB", TRANSFORMERS_TPU_EXT_COMPILE_CACHE=str(cache))
    first = _warmup([str(path), "--infer", "48", "--task", "text-classification", "--max-batch-size", "8", "--json"], env)
    assert first.returncode == 0, first.stderr[-3000:]
    one = json.loads(first.stdout[first.stdout.index("{"):])
    assert one["works"]["infer"]["buckets"] == [[r, n] for r in (1, 2, 4, 8) for n in (16, 32, 48)]
    assert one["programs"]["compiled"] == 12 and one["programs"]["loaded"] == 0  # one graph per bucket, no eager op
    service = subprocess.run([sys.executable, "-c", textwrap.dedent(PIPELINE_SERVICE), str(path)], capture_output=True,
                             text=True, env=env, timeout=900)
    assert service.returncode == 0, service.stderr[-3000:]
    seen = json.loads(service.stdout.split("@@", 1)[1])
    total, steady = seen["total"], seen["steady"]
    assert total["graphs_compiled"] + total["eager_programs"] == 0 and total["programs_loaded"] == 12
    assert steady["graph_calls"] == 13 and steady["eager_ops"] == 0
