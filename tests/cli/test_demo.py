"""The newcomer's first run: `transformers-tpu demo` on the simulated TPU."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

@pytest.mark.slow
def test_demo_runs_the_guide_example_on_the_simulated_tpu():
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRANSFORMERS_TPU_EXT_")}
    env["HF_HUB_OFFLINE"] = "1"
    proc = subprocess.run(
        [sys.executable, "-m", "transformers_tpu_ext.cli", "demo", "--json", "--max-new-tokens", "6"],
        capture_output=True, text=True, env=env, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    # issue 29: the first command's output has no library noise (torchao's CUDA kernels, torch's deprecation)
    output = proc.stdout + proc.stderr
    assert "Failed to load" not in output and "register_constant()" not in output, output[:2000]
    assert "Writing model shards" not in output, output[:2000]
    result = json.loads(proc.stdout[proc.stdout.index("{"):])
    assert result["ran_on"] == "tpu (simulated)"
    assert result["model_device"] == "tpu:0"
    assert len(result["new_tokens"]) == 6
    assert result["counters"]["graphs_compiled"] >= 1  # decode ran compiled on the tpu backend
    assert {"accelerate_memory", "generation"} <= set(result["active_patches"])

    # The same tokens as the same model on CPU, without the plugin.
    reference = subprocess.run(
        [sys.executable, "-c", """
import json, tempfile, torch
from transformers import AutoModelForCausalLM, AutoTokenizer
from transformers_tpu_ext.testing.tiny import save_tiny_model
from transformers_tpu_ext.cli.demo import PROMPT
with tempfile.TemporaryDirectory() as tmp:
    save_tiny_model(tmp)
    tok = AutoTokenizer.from_pretrained(tmp); model = AutoModelForCausalLM.from_pretrained(tmp)
    inputs = tok(PROMPT, return_tensors="pt")
    out = model.generate(**inputs, do_sample=False, max_new_tokens=6)
    print(json.dumps(out[0, inputs["input_ids"].shape[1]:].tolist()))
"""],
        capture_output=True, text=True, env={**env, "TRANSFORMERS_TPU_EXT_DISABLE": "1"}, timeout=300,
    )
    assert reference.returncode == 0, reference.stderr
    assert result["new_tokens"] == json.loads(reference.stdout.strip().splitlines()[-1])


def test_demo_help_and_unknown_command():
    from transformers_tpu_ext import cli

    assert cli.main(["--help"]) == 0
    assert cli.main(["nope"]) == 2


def test_every_demo_option_is_documented():
    import re
    from pathlib import Path

    from transformers_tpu_ext.cli import demo

    options = {a.option_strings[0] for a in demo._parser()._actions if a.option_strings and a.option_strings[0] != "-h"}
    page = (Path(__file__).resolve().parents[2] / "docs" / "getting-started.md").read_text()
    table = page.split("## The demo", 1)[1].split("\n## ", 1)[0]
    documented = set(re.findall(r"^\| `(--[a-z-]+)`", table, re.M))
    assert documented == options


def test_the_commands_drop_only_the_known_library_noise_and_only_while_they_run(caplog):
    import logging

    from transformers_tpu_ext.cli import running

    torchao, pytree = logging.getLogger("torchao"), logging.getLogger("torch.utils._pytree")
    with caplog.at_level(logging.WARNING):
        with running.quiet_library_noise():
            torchao.warning("Failed to load /venv/site-packages/torchao/_C_mxfp8.cpython-310-x86_64-linux-gnu.so: x")
            pytree.warning("%s is an Enum subclass and is now natively supported ... register_constant() ...", "E")
            torchao.warning("Failed to quantize a layer")  # any other line of theirs is kept
        torchao.warning("Failed to load /venv/site-packages/torchao/_C_cutlass_90a.abi3.so: x")  # after the demo
    assert [r.getMessage() for r in caplog.records] == [
        "Failed to quantize a layer", "Failed to load /venv/site-packages/torchao/_C_cutlass_90a.abi3.so: x"]
    assert not torchao.filters and not pytree.filters
