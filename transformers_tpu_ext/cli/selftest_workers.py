"""The checks of ``transformers-tpu selftest`` that need other processes, and those processes.

- ``compile_cache``: two fresh interpreters, one after the other, with the same (temporary) persistent
  compile cache directory, each running one tiny ``generate()``; the second must compile nothing (on
  the simulated TPU: 0 programs compiled, all loaded; on a chip: no new entry in the cache directory).
  Their wall times are the "first vs second start" timing.
- ``ddp``: ``transformers-tpu launch`` of a plain Trainer run on the smallest process count of 2 or
  more the chip generation supports; every rank's parameters must be equal after training.

Run as a script, this module is one such process: ``python selftest_workers.py cache|ddp OUT``.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from typing import Any

_START = time.perf_counter()

#: The simulated TPU of the child processes (small HBM; v5p has a 2-chip topology).
_SIMULATE_CACHE = "chips=1,generation=v6e,hbm=256MiB"
_SIMULATE_DDP = "chips={n},generation=v5p,hbm=256MiB"
_TIMEOUT = 900


def _env(ctx: Any, simulate: str, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TRANSFORMERS_TPU_EXT_", "TORCH_TPU_TIER"))}
    env.update(HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false", PYTHONWARNINGS="ignore")
    if ctx.simulated:
        env["TRANSFORMERS_TPU_EXT_SIMULATE"] = simulate
    env.update(extra)
    return env


def _run(command: list[str], env: dict[str, str], cwd: str) -> subprocess.CompletedProcess:
    proc = subprocess.run(command, capture_output=True, text=True, env=env, cwd=cwd, timeout=_TIMEOUT)
    if proc.returncode != 0:
        tail = (proc.stdout[-1500:] + "\n" + proc.stderr[-2500:]).strip()
        raise AssertionError(f"{' '.join(command[1:3])} exited with {proc.returncode}:\n{tail}")
    return proc


def _cache_entries(root: str) -> int:
    return sum(len(files) for _, _, files in os.walk(root)) if os.path.isdir(root) else 0


def compile_cache(ctx: Any) -> dict[str, Any]:
    root = os.path.join(ctx.tmp, "compile-cache")
    # No TORCH_TPU_* cache variable (the plugin leaves a cache the user configured alone): the plugin's own set-up.
    env = _env(ctx, _SIMULATE_CACHE, TRANSFORMERS_TPU_EXT_COMPILE_CACHE=root)
    starts = []
    for run in ("first", "second"):
        out = os.path.join(ctx.tmp, f"cache-{run}.json")
        _run([sys.executable, __file__, "cache", out], env, ctx.tmp)
        with open(out, encoding="utf-8") as handle:
            starts.append({**json.load(handle), "entries": _cache_entries(root)})
    first, second = starts
    assert first["tokens"] == second["tokens"], f"the second start generated {second['tokens']}, the first {first['tokens']}"
    assert first["entries"] > 0, (
        f"the first start wrote nothing to the compile cache {root} (on a chip, torch_tpu's host-wide tier-2 cache in "
        "/dev/shm/torch_tpu_cache may have served it from an earlier run)"
    )
    if first.get("compiled") is not None:  # the simulated TPU tells compiled from loaded
        assert first["compiled"] > 0, "the first start compiled nothing (the check proves nothing)"
        assert second["compiled"] == 0, f"the second start compiled {second['compiled']} programs (loaded {second['loaded']})"
    assert second["entries"] == first["entries"], (
        f"the second start added {second['entries'] - first['entries']} entries to the compile cache (it compiled)"
    )
    ctx.timings["first_start_s"] = round(first["seconds"], 3)
    ctx.timings["second_start_s"] = round(second["seconds"], 3)
    return {"entries": first["entries"], "first": first, "second": second}


def _ddp_count(ctx: Any) -> int:
    from .. import backend
    from ..core import topology

    if ctx.simulated:
        if not ctx.options.get("ddp"):
            from .selftest_battery import Skip

            raise Skip("one simulated chip here; --ddp runs it on 2 simulated chips (tests/training covers DDP in CI)")
        return 2
    chips = backend.device_count()
    info = backend.chip_info()
    counts = topology.supported_counts(getattr(info, "generation", None)) or (2, 4, 8)
    usable = [n for n in counts if 2 <= n <= chips]
    if not usable:
        from .selftest_battery import Skip

        raise Skip(f"this host has {chips} chip(s); DDP needs 2 or more in a supported topology ({counts})")
    return usable[0]


def ddp(ctx: Any) -> dict[str, Any]:
    count = _ddp_count(ctx)
    out = os.path.join(ctx.tmp, "ddp")
    os.makedirs(out, exist_ok=True)
    env = _env(ctx, _SIMULATE_DDP.format(n=count))
    _run([sys.executable, "-m", "transformers_tpu_ext.launch", f"--nproc_per_node={count}", __file__, "ddp", out], env, ctx.tmp)
    ranks = []
    for rank in range(count):
        with open(os.path.join(out, f"rank{rank}.json"), encoding="utf-8") as handle:
            ranks.append(json.load(handle))
    assert all(r["device"] == "tpu" for r in ranks), f"ranks trained on {[r['device'] for r in ranks]}"
    assert all(r["wrapped"] for r in ranks), "the Trainer did not wrap the model in DistributedDataParallel"
    digests = {r["digest"] for r in ranks}
    assert len(digests) == 1, f"replicas diverged: {len(digests)} different parameter sets over {count} ranks"
    return {"processes": count, "losses": ranks[0]["losses"]}


# ---------------------------------------------------------------------------------------------
# The child processes.


def _cache_worker(out: str) -> None:
    import torch

    from transformers_tpu_ext import testing
    from transformers_tpu_ext.testing.tiny import tiny_model

    # One layer: a start traces every layer of the model (the second start too, whatever its cache holds).
    model = tiny_model("qwen3", seed=0, num_hidden_layers=1).to("tpu")
    ids = torch.randint(2, model.config.vocab_size, (1, 9), generator=torch.Generator().manual_seed(0))
    tokens = model.generate(ids.to("tpu"), max_new_tokens=3, min_new_tokens=3, do_sample=False).cpu().tolist()
    sim = testing.simulated_tpu()
    counters = sim.counters() if sim is not None else None
    result = {
        "tokens": tokens,
        "seconds": time.perf_counter() - _START,
        "misses": int(torch.tpu._get_cache_misses()),
        "compiled": None if counters is None else counters.programs,
        "loaded": None if counters is None else counters.programs_loaded,
    }
    with open(out, "w", encoding="utf-8") as handle:
        json.dump(result, handle)


def _ddp_worker(out: str) -> None:
    import torch
    from transformers import DataCollatorForLanguageModeling, Trainer, TrainingArguments

    from transformers_tpu_ext.testing.tiny import tiny_lm_dataset, tiny_model, tiny_tokenizer

    tokenizer = tiny_tokenizer()
    tokenizer.padding_side = "right"
    args = TrainingArguments(
        output_dir=os.path.join(out, "run"), per_device_train_batch_size=2, max_steps=4, logging_steps=1,
        report_to=[], learning_rate=1e-3, save_strategy="no", seed=0, disable_tqdm=True,
    )
    run = Trainer(model=tiny_model("qwen3", seed=0), args=args, train_dataset=tiny_lm_dataset(num_examples=32, max_length=40),
                  data_collator=DataCollatorForLanguageModeling(tokenizer, mlm=False))
    run.train()
    digest = hashlib.sha256()
    for name, param in sorted(run.model.named_parameters()):
        digest.update(name.encode())
        digest.update(param.detach().cpu().contiguous().numpy().tobytes())
    rank = int(os.environ.get("RANK", "0"))
    result = {
        "device": next(run.model.parameters()).device.type,
        "wrapped": isinstance(run.model_wrapped, torch.nn.parallel.DistributedDataParallel),
        "digest": digest.hexdigest(),
        "losses": [e["loss"] for e in run.state.log_history if "loss" in e],
    }
    with open(os.path.join(out, f"rank{rank}.json"), "w", encoding="utf-8") as handle:
        json.dump(result, handle)


if __name__ == "__main__":
    {"cache": _cache_worker, "ddp": _ddp_worker}[sys.argv[1]](sys.argv[2])
