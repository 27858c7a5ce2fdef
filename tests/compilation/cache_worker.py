"""One process of the compile-cache tests: a tiny model's generate() on the simulated TPU; prints counters.

    python cache_worker.py [--version V]   # V: the simulated torch_tpu release (entries are keyed by it)
"""

from __future__ import annotations

import argparse
import json
import os


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--version", default=None)
    args = parser.parse_args()
    import torch

    from transformers_tpu_ext import compilation, testing
    from transformers_tpu_ext.testing.tiny import tiny_model

    sim = testing.install(chips=1)
    if args.version:
        sim.compile_cache.version = args.version
    model = tiny_model("qwen3", seed=0).to("tpu")
    ids = torch.randint(2, 300, (2, 9), generator=torch.Generator().manual_seed(0))
    out = model.generate(ids.to("tpu"), max_new_tokens=3, do_sample=False)
    report = compilation.cache_report()
    print("@@RESULT@@" + json.dumps({
        "counters": sim.counters().asdict(),
        "root": os.environ.get("TORCH_TPU_TIER3_COMPILATION_CACHE_ROOT"),
        "report": {k: report.get(k) for k in ("root", "set_by", "entries", "reason")},
        "tokens": out.tolist(),
    }), flush=True)


if __name__ == "__main__":
    main()
