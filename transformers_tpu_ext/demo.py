"""``transformers-tpu demo``: the Google TPU guide's generation example, with nothing to set up.

It runs the guide's code as a user writes it (tokenizer, ``from_pretrained(...,
device_map="auto")``, inputs left on CPU, ``generate``) on the real TPU when there is one and on
the simulated TPU otherwise. Without ``--model`` it builds a tiny model and tokenizer locally, so it
never needs the Hub. It prints where the model ran, the tokens and the compile counters.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from typing import Any

PROMPT = "The secret to baking a good cake is"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="transformers-tpu demo", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", help="a Hub id or local path (default: a tiny model built locally)")
    parser.add_argument("--prompt", default=PROMPT)
    parser.add_argument("--max-new-tokens", type=int, default=20)
    parser.add_argument("--sample", action="store_true", help="sample (seeded) instead of greedy decoding")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--simulate",
        choices=["auto", "always", "never"],
        default="auto",
        help="use the simulated TPU: when no real TPU is found (auto), always, or never",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    return parser


def _prepare_device(mode: str) -> tuple[str, Any]:
    """Returns (where, simulator or None)."""
    import torch  # noqa: F401 - activates the plugin (and torch_tpu) through their entry points

    import transformers_tpu_ext  # noqa: F401 - in case entry points are disabled
    from transformers_tpu_ext import backend, testing

    if mode != "always" and backend.tpu_available() and not testing.is_installed():
        return "tpu", None
    if mode == "never":
        return "cpu", None
    sim = testing.install()
    return "tpu (simulated)", sim


def run(args: argparse.Namespace) -> dict[str, Any]:
    where, sim = _prepare_device(args.simulate)
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from transformers_tpu_ext import active_patches, backend

    with tempfile.TemporaryDirectory() as tmp:
        model_path = args.model
        if model_path is None:
            from transformers_tpu_ext.testing.tiny import save_tiny_model

            model_path = save_tiny_model(tmp)
        if sim is not None:
            sim.reset_counters()
        start = time.perf_counter()
        # The guide's example, as a user writes it with the plugin installed.
        tokenizer = AutoTokenizer.from_pretrained(model_path)
        model = AutoModelForCausalLM.from_pretrained(model_path, dtype="auto", device_map="auto")
        inputs = tokenizer(args.prompt, return_tensors="pt")  # left on CPU
        torch.manual_seed(args.seed)
        output = model.generate(**inputs, do_sample=args.sample, max_new_tokens=args.max_new_tokens)
        elapsed = time.perf_counter() - start

    prompt_len = inputs["input_ids"].shape[1]
    new_tokens = output[0, prompt_len:].tolist()
    info = backend.chip_info()
    result: dict[str, Any] = {
        "ran_on": where if backend.is_tpu(model.device) else str(model.device),
        "model_device": str(model.device),
        "device_map": getattr(model, "hf_device_map", None),
        "chip": None if info is None else {"name": info.name, "chips": info.count, "hbm_bytes": info.total_memory},
        "prompt": args.prompt,
        "new_tokens": new_tokens,
        "text": tokenizer.decode(output[0], skip_special_tokens=True),
        "active_patches": active_patches(),
        "seconds": round(elapsed, 3),
    }
    if sim is not None:
        result["counters"] = sim.counters().asdict()
    return result


def _print_text(result: dict[str, Any]) -> None:
    print(f"ran on:          {result['ran_on']}")
    if result["chip"]:
        chip = result["chip"]
        print(f"chip:            {chip['name']} x{chip['chips']}, {chip['hbm_bytes'] / 2**30:.0f} GiB HBM each")
    device_map = result["device_map"] or f"(one device: the whole model is on {result['model_device']})"
    print(f"device map:      {device_map}")
    print(f"active patches:  {', '.join(result['active_patches']) or '(none)'}")
    print(f"prompt:          {result['prompt']!r}")
    print(f"new tokens:      {result['new_tokens']}")
    print(f"text:            {result['text']!r}")
    counters = result.get("counters")
    if counters:
        print("compile counters: " + ", ".join(f"{k}={v}" for k, v in counters.items()))
    else:
        print("compile counters: (only the simulated TPU counts programs)")
    print(f"time:            {result['seconds']} s")


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    result = run(args)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        _print_text(result)
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
