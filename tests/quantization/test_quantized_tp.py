"""int8 weight-only (torchao) with tensor parallelism, end to end on 4 simulated v6e chips.

``transformers-tpu launch --nproc_per_node=4``: each rank loads a tiny Qwen3 (2 key-value heads for 4 ranks,
so the plugin's plan rewrite replicates them; tied embeddings) with ``TorchAoConfig(Int8WeightOnlyConfig())``
and ``DistributedConfig(tp_size=4)``, and generates greedily with the TPU defaults (static cache, compiled
decode). Rank 0 compares the tokens with the unsharded int8 model's on the CPU.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from transformers_tpu_ext.testing.tiny import save_tiny_model

pytest.importorskip("torchao")

pytestmark = pytest.mark.slow

SCRIPT = r'''
import json, sys, warnings
warnings.filterwarnings("ignore")
import torch
import torch.distributed as dist
from torchao.quantization import Int8WeightOnlyConfig
from transformers import AutoModelForCausalLM, TorchAoConfig
from transformers.distributed import DistributedConfig

path, out = sys.argv[1], sys.argv[2]
ids = torch.tensor([[3, 17, 42, 9, 88, 5, 61]])
model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, quantization_config=TorchAoConfig(Int8WeightOnlyConfig()),
                                             distributed_config=DistributedConfig(tp_size=4))
q = model.model.layers[0].self_attn.q_proj.weight
result = {"world_size": dist.get_world_size(), "q_proj": [type(q).__name__, str(q.qdata.dtype), str(q.qdata.device), list(q.qdata.shape)]}
result["tokens"] = model.generate(ids.to(model.device), max_new_tokens=8, do_sample=False).cpu().tolist()
if dist.get_rank() == 0:
    import transformers_tpu_ext.testing as testing
    with testing.simulated_tpu().hidden():
        reference = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, quantization_config=TorchAoConfig(Int8WeightOnlyConfig()))
        result["ref_tokens"] = reference.generate(ids, max_new_tokens=8, do_sample=False).tolist()
    with open(out, "w") as handle:
        json.dump(result, handle)
dist.destroy_process_group()
'''


def test_int8_weights_shard_over_four_chips_and_give_the_unsharded_tokens(tmp_path: Path) -> None:
    model = save_tiny_model(tmp_path / "qwen3", "qwen3")
    script = tmp_path / "generate.py"
    script.write_text(SCRIPT)
    out = tmp_path / "rank0.json"
    env = {**os.environ, "TRANSFORMERS_TPU_EXT_SIMULATE": "generation=v6e", "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    env.pop("TRANSFORMERS_TPU_EXT_DISABLE", None)
    proc = subprocess.run(
        [sys.executable, "-m", "transformers_tpu_ext.launch", "--nproc_per_node=4", str(script), str(model), str(out)],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    result = json.loads(out.read_text())
    assert result["world_size"] == 4
    # A local int8 shard per rank: 32 query rows of 4 heads x 8 split over 4 ranks.
    assert result["q_proj"] == ["Int8Tensor", "torch.int8", "tpu:0", [8, 32]]
    assert result["tokens"] == result["ref_tokens"]
