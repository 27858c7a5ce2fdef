"""One rank of ``test_training_multiprocess.py``: run each scenario of a spec, write what this rank saw.

Started by ``transformers-tpu launch`` with ``TRANSFORMERS_TPU_EXT_SIMULATE`` set: plain Trainer and
Accelerate code, nothing TPU-specific. A scenario's ``kind`` (default ``train``) picks what it runs:

- ``train``: a Trainer run (``_training.trainer``); ``expect_error`` records a ``RuntimeError``;
  ``output_dir`` is relative to the launcher's working directory (a host's local disk); ``model:
  "gated"`` trains ``_training.gated_model()``; ``use_cpu`` trains on the CPU (a reference launch
  without the simulator).
- ``gather``: ``accelerator.gather_for_metrics`` of 1-D, 2-D and 3-D tensors from a prepared loader
  whose last global batch is partial (Accelerate drops the duplicated rows).
- ``evaluate``: ``Trainer.evaluate()`` and ``Trainer.predict()`` of the tiny Qwen3 on 10 examples.
- ``replicas``: a plain Accelerate loop; the model prepared (``prepare_model``), or moved to the TPU by
  hand with the optimizer and the loader prepared, or only the loader (``prepare_optimizer: false``).

The ``gather``, ``evaluate`` and ``replicas`` kinds record an error as ``{"error": ...}`` so the
scenarios after them still run (every rank raises at the same point, so no rank waits on another).
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import traceback
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


def train(scenario: dict, out: Path) -> dict:
    sim = testing.simulated_tpu()  # None in a CPU reference launch (``use_cpu``)
    syncs = sim.synchronizations if sim is not None else 0
    settings = dict(scenario.get("settings", {}))
    output_dir = Path(scenario["output_dir"]) if "output_dir" in scenario else out / scenario["name"]
    use_cpu = bool(scenario.get("use_cpu"))
    model = _training.gated_model() if scenario.get("model") == "gated" else None
    if scenario.get("expect_error"):
        try:
            _training.trainer(str(output_dir), use_cpu=use_cpu, model=model, **settings).train()
        except RuntimeError as error:
            return {"error": str(error)}
        return {"error": None}
    model_init = {"never": model.never.weight.detach().clone()} if model is not None else {}
    counter = _training.step_counter(sim) if sim is not None else None
    run = _training.trainer(str(output_dir), use_cpu=use_cpu, model=model, callbacks=[counter] if counter else [], **settings)
    if scenario.get("warmup"):
        from transformers_tpu_ext.training import warmup

        warmup(run, max_length=scenario["warmup"])
    run.train(resume_from_checkpoint=scenario.get("resume"))
    return {
        "world": run.args.world_size,
        "process_index": run.args.process_index,
        "node_rank": os.environ.get("GROUP_RANK"),
        "device": str(run.args.device),
        "accelerator_device": str(run.accelerator.device),
        "distributed_type": str(run.accelerator.distributed_type).split(".")[-1],
        "backend": run.accelerator.state.backend,
        "wrapper": type(run.model_wrapped).__name__,
        "losses": _training.losses(run),
        "params_on_tpu": all(p.device.type == "tpu" for p in run.model.parameters()),
        "synchronizations": sim.synchronizations - syncs if sim is not None else None,
        "programs_per_step": [c.programs for c in counter.steps] if counter else None,
        "digest": parameter_digest(run.model),
        # which of the gated model's rarely used parameters moved (a parameter with no gradient stays)
        **({"unused_grads": {"gate": float(run.model.gate.detach().cpu()) != 1.0,
                             "never": bool(torch.ne(run.model.never.weight.detach().cpu(), model_init["never"]).any())}}
           if model is not None else {}),
    }


def _loader(rows: list, batch_size: int) -> torch.utils.data.DataLoader:
    return torch.utils.data.DataLoader(rows, batch_size=batch_size, collate_fn=_training.collator())


def gather(scenario: dict, out: Path) -> dict:
    from accelerate import Accelerator

    from transformers_tpu_ext.testing.tiny import tiny_lm_dataset

    _training.reset_accelerate()
    accelerator = Accelerator()
    rows = [{"input_ids": r["input_ids"][:12]} for r in tiny_lm_dataset(scenario["rows"], min_length=12, seed=3)]
    loader = accelerator.prepare(_loader(rows, scenario["batch_size"]))
    seen: dict[str, list] = {"index": [], "ids": [], "logits": []}
    for batch in loader:
        ids = batch["input_ids"]  # (rows, 12), long, on the TPU
        index = ids[:, 0].float()  # 1-D
        logits = torch.stack([ids.float(), -ids.float()], dim=-1)  # 3-D (rows, 12, 2)
        gathered = accelerator.gather_for_metrics((index, ids, logits))
        for key, value in zip(("index", "ids", "logits"), gathered):
            seen[key].append(value.cpu().tolist())
    flat = {key: [row for batch in batches for row in batch] for key, batches in seen.items()}
    return {
        "distributed_type": str(accelerator.distributed_type).split(".")[-1],
        "backend": accelerator.state.backend,
        "ids": flat["ids"],
        "logits": flat["logits"],
        "index": flat["index"],
        "expected_ids": [r["input_ids"] for r in rows],
    }


def evaluate(scenario: dict, out: Path) -> dict:
    from transformers_tpu_ext.testing.tiny import tiny_lm_dataset

    settings = dict(scenario.get("settings", {}))
    run = _training.trainer(str(out / scenario["name"]), use_cpu=False, eval_data=tiny_lm_dataset(10, seed=5), **settings)
    metrics = run.evaluate()
    prediction = run.predict(tiny_lm_dataset(10, seed=5))
    return {
        "world": run.args.world_size,
        "eval_loss": metrics["eval_loss"],
        "predict_loss": prediction.metrics["test_loss"],
        "prediction_rows": int(prediction.predictions.shape[0]),
        "label_rows": int(prediction.label_ids.shape[0]),
    }


def replicas(scenario: dict, out: Path) -> dict:
    """A plain Accelerate loop; the model is prepared or moved to the TPU by hand."""
    from accelerate import Accelerator

    from transformers_tpu_ext.testing.tiny import tiny_lm_dataset, tiny_model

    _training.reset_accelerate()
    accelerator = Accelerator()
    torch.manual_seed(0)
    model = tiny_model("qwen3", seed=0)
    model.train()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    loader = _loader(tiny_lm_dataset(16, max_length=24, seed=1), 2)
    if scenario.get("prepare_model"):
        model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    else:
        model.to(accelerator.device)  # by hand, as a single-device script does
        if scenario.get("prepare_optimizer", True):
            optimizer, loader = accelerator.prepare(optimizer, loader)
        else:
            loader = accelerator.prepare(loader)
    steps, error = 0, None
    try:
        for batch in loader:
            loss = model(**batch).loss
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            steps += 1
            if steps == 3:
                break
    except RuntimeError as raised:
        error = str(raised)
    return {"error": error, "steps": steps, "digest": parameter_digest(accelerator.unwrap_model(model))}


KINDS = {"train": train, "gather": gather, "evaluate": evaluate, "replicas": replicas}


def _recorded(kind, scenario: dict, out: Path) -> dict:
    try:
        return kind(scenario, out)
    except Exception as error:  # noqa: BLE001 - recorded, the test asserts on it
        return {"error": f"{type(error).__name__}: {error}", "trace": traceback.format_exc()[-3000:]}


def main() -> None:
    spec = json.loads(Path(sys.argv[1]).read_text())
    out = Path(spec["out"])
    rank = int(os.environ["RANK"])
    torch.set_num_threads(1)
    results = {"world_size": int(os.environ["WORLD_SIZE"])}
    for scenario in spec["scenarios"]:
        environ = dict(os.environ)  # TrainingArguments(fsdp=...) leaves ACCELERATE_USE_FSDP & co. behind
        kind = scenario.get("kind", "train")
        if kind == "train":
            results[scenario["name"]] = train(scenario, out)
        else:
            results[scenario["name"]] = _recorded(KINDS[kind], scenario, out)
        os.environ.clear()
        os.environ.update(environ)
    (out / f"rank{rank}.json").write_text(json.dumps(results))


if __name__ == "__main__":
    main()
