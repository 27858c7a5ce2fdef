"""One rank of ``test_training_multiprocess.py``: run each scenario of a spec, write what this rank saw.

Started by ``transformers-tpu launch --nproc_per_node=N`` with ``TRANSFORMERS_TPU_EXT_SIMULATE`` set:
plain Trainer code, nothing TPU-specific.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, os.path.dirname(__file__))

import _training  # noqa: E402

from transformers_tpu_ext import testing  # noqa: E402


def parameter_digest(model: torch.nn.Module) -> str:
    digest = hashlib.sha256()
    for name, param in sorted(model.named_parameters()):
        full = param.full_tensor() if hasattr(param, "full_tensor") else param
        digest.update(name.encode())
        digest.update(full.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()


def run(scenario: dict, out: Path, rank: int) -> dict:
    sim = testing.simulated_tpu()
    syncs = sim.synchronizations
    settings = dict(scenario.get("settings", {}))
    if scenario.get("expect_error"):
        try:
            _training.trainer(str(out / scenario["name"]), use_cpu=False, **settings).train()
        except RuntimeError as error:
            return {"error": str(error)}
        return {"error": None}
    counter = _training.step_counter(sim)
    run = _training.trainer(str(out / scenario["name"]), use_cpu=False, callbacks=[counter], **settings)
    if scenario.get("warmup"):
        from transformers_tpu_ext.training import warmup

        warmup(run, max_length=scenario["warmup"])
    run.train()
    result = {
        "world": run.args.world_size,
        "device": str(run.args.device),
        "accelerator_device": str(run.accelerator.device),
        "distributed_type": str(run.accelerator.distributed_type).split(".")[-1],
        "backend": run.accelerator.state.backend,
        "wrapper": type(run.model_wrapped).__name__,
        "losses": _training.losses(run),
        "params_on_tpu": all(p.device.type == "tpu" for p in run.model.parameters()),
        "synchronizations": sim.synchronizations - syncs,
        "programs_per_step": [c.programs for c in counter.steps],
    }
    result["digest"] = parameter_digest(run.model)
    return result


def main() -> None:
    spec = json.loads(Path(sys.argv[1]).read_text())
    out = Path(spec["out"])
    rank = int(os.environ["RANK"])
    torch.set_num_threads(1)
    results = {}
    for scenario in spec["scenarios"]:
        environ = dict(os.environ)  # TrainingArguments(fsdp=...) leaves ACCELERATE_USE_FSDP & co. behind
        results[scenario["name"]] = run(scenario, out, rank)
        os.environ.clear()
        os.environ.update(environ)
    (out / f"rank{rank}.json").write_text(json.dumps(results))


if __name__ == "__main__":
    main()
