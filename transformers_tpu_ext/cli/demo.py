"""``transformers-tpu demo``: the Google TPU guide's generation example, with nothing to set up.

It runs the guide's code as a user writes it (tokenizer, ``from_pretrained(...,
device_map="auto")``, inputs left on CPU, ``generate``) on the real TPU when there is one and on
the simulated TPU otherwise (configured by ``TRANSFORMERS_TPU_EXT_SIMULATE`` when set). Without
``--model`` it builds a tiny model and tokenizer locally, with random weights (so its text is
gibberish, and it says so), and never needs the Hub. It prints where the model ran, the tokens and
the compile counters. A bad argument or setting, or a model that cannot be found (not a model
directory, not in the Hugging Face cache, not on a reachable Hub), is one error line, at once, before
anything loads; a failure while it runs is one line too (:mod:`.running`).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import tempfile
import time
from collections.abc import Iterator
from typing import Any

from . import running
from .args import CommandError, Parser, check_settings, parse, positive_int, seed
from .models import resolve_model

PROG = "transformers-tpu demo"
PROMPT = "The secret to baking a good cake is"


@contextlib.contextmanager
def _no_progress_bars() -> Iterator[None]:
    """No progress bar while the demo writes its own tiny model (the user's load keeps Transformers' own)."""
    from transformers.utils import logging as hf_logging

    enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if enabled:
            hf_logging.enable_progress_bar()


class DemoError(CommandError):
    """A demo request that cannot work; ``str()`` says what to do. ``exit_code`` is 1 or 2."""


def _parser() -> argparse.ArgumentParser:
    parser = Parser(prog=PROG, description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", help="a Hub id or local path (default: a tiny model built locally)")
    parser.add_argument("--prompt", default=PROMPT, help="the prompt (not empty)")
    parser.add_argument("--max-new-tokens", type=positive_int, default=20, help="tokens to generate (>= 1)")
    parser.add_argument("--sample", action="store_true", help="sample (seeded) instead of greedy decoding")
    parser.add_argument("--seed", type=seed, default=0, help="the seed of torch.manual_seed")
    parser.add_argument(
        "--simulate",
        choices=["auto", "always", "never"],
        default="auto",
        help="use the simulated TPU: when no real TPU is found (auto), always, or never",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    return parser


def check(args: argparse.Namespace) -> None:
    """Raise ``DemoError`` for a request that cannot work, before anything loads (the model is :func:`run`'s)."""
    if not args.prompt.strip():
        raise DemoError("--prompt is empty: pass some text to continue (default: the guide's prompt)")
    check_settings()


def _prepare_device(mode: str) -> tuple[str, Any]:
    """Returns (where, simulator or None)."""
    import torch  # noqa: F401 - activates the plugin (and torch_tpu) through their entry points

    import transformers_tpu_ext  # noqa: F401 - in case entry points are disabled
    from transformers_tpu_ext import backend, testing

    if mode != "always" and backend.tpu_available() and not testing.is_installed():
        return "tpu", None
    if mode == "never":
        return "cpu", None
    sim = testing.simulated_tpu()  # installed at `import torch` from TRANSFORMERS_TPU_EXT_SIMULATE: keep it
    if sim is None:
        sim = testing.install(**_simulate_spec())
    return "tpu (simulated)", sim


def _simulate_spec() -> dict[str, Any]:
    """``install()`` kwargs from ``TRANSFORMERS_TPU_EXT_SIMULATE`` (defaults when unset); ``DemoError`` if invalid."""
    from transformers_tpu_ext.testing import chips

    spec = os.environ.get(chips.SIMULATE_ENV, "")
    if not chips.simulate_requested(spec):
        return {}
    try:
        return chips.parse_spec(spec)
    except ValueError as error:
        raise DemoError(str(error)) from None


def run(args: argparse.Namespace) -> dict[str, Any]:
    if args.model is not None:
        resolve_model(args.model)  # before importing torch: a wrong name fails at once
    where, sim = _prepare_device(args.simulate)
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from transformers_tpu_ext import active_patches
    from transformers_tpu_ext import backend

    with tempfile.TemporaryDirectory() as tmp:
        model_path = args.model
        if model_path is None:
            from transformers_tpu_ext.testing.tiny import save_tiny_model

            with _no_progress_bars():
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
        "model": args.model or "tiny local model",
        "random_weights": args.model is None,
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


def _size(n: int) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{n} B"


def _print_text(result: dict[str, Any]) -> None:
    print(f"ran on:          {result['ran_on']}")
    if result["chip"]:
        chip = result["chip"]
        print(f"chip:            {chip['name']} x{chip['chips']}, {_size(chip['hbm_bytes'])} HBM each")
    if result["random_weights"]:
        print("model:           tiny local model with random weights: its text is gibberish by design "
              "(pass --model Qwen/Qwen3-0.6B for a real one)")
    else:
        print(f"model:           {result['model']}")
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
    args = parse(_parser(), argv)
    if isinstance(args, int):  # --help, or a usage error (already said)
        return args

    def work() -> int:
        check(args)
        result = run(args)
        if args.json:
            print(json.dumps(result, indent=2))
        else:
            _print_text(result)
        return 0

    return running.run(PROG, work)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
