"""The guide's tensor-parallel example, end to end on the simulated TPU.

``transformers-tpu launch --nproc_per_node=4 generate.py`` with ``TRANSFORMERS_TPU_EXT_SIMULATE`` set:
each worker is bound to ``tpu:0``, Transformers initialises ``torch.distributed`` with ``tpu_dist``
(its ``DISTRIBUTED_BACKEND_MAP`` entry for the ``tpu`` device; the simulator's backend is gloo on the
tensors' CPU data), shards a GLM-4-like model with 2 key-value heads over 4 ranks (the
``tp_plan_rewrite`` KV replication) and generates greedily. Rank 0 compares the tokens with the
unsharded model's.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import _tp_models

pytestmark = pytest.mark.slow

NPROC = 4

# The guide's example (docs/tensor-parallelism.md) on a local tiny model; rank 0 writes what it saw.
SCRIPT = r'''
import json, sys
import torch
import torch.distributed as dist
from transformers import AutoModelForCausalLM
from transformers.distributed import DistributedConfig

path, out = sys.argv[1], sys.argv[2]
ids = torch.tensor([[3, 17, 42, 9, 88, 5, 61]])
model = AutoModelForCausalLM.from_pretrained(path, distributed_config=DistributedConfig(tp_size=4))
k_proj = model.model.layers[0].self_attn.k_proj.weight
result = {
    "backend": dist.get_backend(),
    "world_size": dist.get_world_size(),
    "device": str(model.device),
    "k_proj": [type(k_proj).__name__, str(k_proj.device), list(k_proj.to_local().shape)],
}
# Decode with the dynamic cache, then with what the plugin picks on a TPU (static cache, compiled).
tokens = model.generate(ids.to(model.device), max_new_tokens=8, do_sample=False, cache_implementation="dynamic")
result["tokens"] = tokens.cpu().tolist()
result["out_device"] = str(tokens.device)
try:
    result["tpu_tokens"] = model.generate(ids.to(model.device), max_new_tokens=8, do_sample=False).cpu().tolist()
except Exception as error:
    result["tpu_error"] = f"{type(error).__name__}: {error}"[:600]
if dist.get_rank() == 0:
    reference = AutoModelForCausalLM.from_pretrained(path)  # unsharded, on CPU
    result["ref_tokens"] = reference.generate(ids, max_new_tokens=8, do_sample=False).tolist()
    with open(out, "w") as handle:
        json.dump(result, handle)
dist.destroy_process_group()
'''


def test_guide_tp_example_runs_on_tpu_dist_through_the_launcher(tmp_path: Path) -> None:
    model = tmp_path / "glm_kv2"
    _tp_models.save("glm_kv2", model)  # 2 KV heads on 4 ranks: each replicated on 2 ranks
    script = tmp_path / "generate.py"
    script.write_text(SCRIPT)
    out = tmp_path / "rank0.json"
    env = {
        **os.environ,
        "TRANSFORMERS_TPU_EXT_SIMULATE": "generation=v6e",
        "OMP_NUM_THREADS": "1",
        "PYTHONWARNINGS": "ignore",
    }
    env.pop("TRANSFORMERS_TPU_EXT_DISABLE", None)
    env.pop("TRANSFORMERS_TPU_EXT_TP_REWRITE", None)  # the default (auto): the TPU path rewrites, no opt-in
    proc = subprocess.run(
        [sys.executable, "-m", "transformers_tpu_ext.launch", f"--nproc_per_node={NPROC}"]
        + [str(script), str(model), str(out)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    result = json.loads(out.read_text())
    assert result["backend"] == "tpu_dist" and result["world_size"] == NPROC
    assert result["device"] == "tpu:0"
    # k_proj is a DTensor on the chip holding one of the 2 KV heads (head_dim 8 rows of 64).
    assert result["k_proj"] == ["DTensor", "tpu:0", [8, 64]]
    assert result["out_device"] == "tpu:0"
    assert result["tokens"] == result["ref_tokens"]
    assert len(result["tokens"][0]) == 7 + 8
    # The plain generate() a user writes takes the TPU defaults (static cache, compiled decode); its
    # cache is sized for one KV head per rank (patch tp_kv_cache).
    assert "tpu_error" not in result, result.get("tpu_error")
    assert result["tpu_tokens"] == result["ref_tokens"]
