"""``transformers-tpu demo``: the Google TPU guide's generation example, with nothing to set up.

It runs the guide's code as a user writes it (tokenizer, ``from_pretrained(...,
device_map="auto")``, inputs left on CPU, ``generate``) on the real TPU when there is one and on
the simulated TPU otherwise (configured by ``TRANSFORMERS_TPU_EXT_SIMULATE`` when set). Without
``--model`` it builds a tiny model and tokenizer locally, with random weights (so its text is
gibberish, and it says so), and never needs the Hub. It prints where the model ran, the tokens and
the compile counters. A model that cannot be found (not a local directory, not in the Hugging Face
cache, not on a reachable Hub) is one error line, at once.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import sys
import tempfile
import time
from collections.abc import Iterator
from typing import Any

PROG = "transformers-tpu demo"
PROMPT = "The secret to baking a good cake is"
#: Seconds to wait for the Hub before saying it cannot be reached.
HUB_TIMEOUT = 10.0


#: Lines libraries log while the demo imports them that say nothing about the demo (issue 29): torchao's
#: optional CUDA kernels, which a CPU or TPU host cannot load (Transformers imports torchao), and
#: torch's deprecation of ``register_constant()`` on enums, which torchao calls. (logger, words of the
#: message): dropped in the demo only, while it runs; never for user code.
NOISE: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("torchao", ("Failed to load ", "torchao", ".so")),
    ("torch.utils._pytree", ("is an Enum subclass", "register_constant()")),
)


class _DropNoise(logging.Filter):
    def __init__(self, words: tuple[str, ...]) -> None:
        super().__init__()
        self.words = words

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            text = record.getMessage()
        except Exception:  # noqa: BLE001 - a record we cannot format is not ours to drop
            return True
        return not all(word in text for word in self.words)


@contextlib.contextmanager
def quiet_library_noise() -> Iterator[None]:
    """Drop the :data:`NOISE` records (only those) while the demo runs."""
    filters = [(logging.getLogger(name), _DropNoise(words)) for name, words in NOISE]
    for logger, noise in filters:
        logger.addFilter(noise)
    try:
        yield
    finally:
        for logger, noise in filters:
            logger.removeFilter(noise)


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


class DemoError(Exception):
    """A demo request that cannot work; ``str()`` says what to do. ``exit_code`` is 1 or 2."""

    def __init__(self, message: str, exit_code: int = 2) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
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


def resolve_model(name: str, timeout: float = HUB_TIMEOUT) -> str:
    """``name`` if it can be loaded: a local directory, a Hub id in the cache, or one the Hub has.

    Raises ``DemoError`` at once otherwise (Transformers would retry the Hub for about a minute,
    then raise a long traceback).
    """
    if os.path.isdir(name):
        return name
    if os.path.exists(name) or name.startswith((".", "/", "~")) or name.count("/") > 1:
        raise DemoError(f"--model {name!r}: no such directory; pass a local model directory or a Hub id such as Qwen/Qwen3-0.6B.")
    from huggingface_hub import HfApi, try_to_load_from_cache
    from huggingface_hub.utils import HfHubHTTPError, HFValidationError

    try:
        cached = try_to_load_from_cache(name, "config.json")
    except HFValidationError:
        raise DemoError(
            f"--model {name!r}: not a local directory and not a valid Hub id; pass a local model directory "
            "or a Hub id such as Qwen/Qwen3-0.6B."
        ) from None
    if isinstance(cached, str):
        return name
    if os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in {"1", "true", "yes", "on"}:
        raise DemoError(
            f"--model {name!r}: not a local directory and not in the Hugging Face cache, and HF_HUB_OFFLINE is set; "
            "download it first (unset HF_HUB_OFFLINE) or pass a local directory."
        )
    try:
        HfApi().model_info(name, timeout=timeout)
    except HfHubHTTPError as error:
        status = getattr(getattr(error, "response", None), "status_code", None)
        if status in (401, 403, 404):
            raise DemoError(
                f"--model {name!r}: no such model on the Hugging Face Hub (or it is private or gated: "
                "log in with `hf auth login`); pass a Hub id such as Qwen/Qwen3-0.6B or a local directory."
            ) from None
        raise DemoError(f"--model {name!r}: the Hugging Face Hub answered {error}", exit_code=1) from None
    except Exception as error:  # noqa: BLE001 - no network, DNS, timeout
        raise DemoError(
            f"--model {name!r}: not a local directory, not in the Hugging Face cache, and the Hub cannot be reached "
            f"({type(error).__name__}: {error}); pass a local directory, or run where the Hub is reachable.",
            exit_code=1,
        ) from None
    return name


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
    try:
        args = _parser().parse_args(argv)
    except SystemExit as exit_:  # --help, or argparse's usage error (already printed)
        return exit_.code if isinstance(exit_.code, int) else 2
    try:
        with quiet_library_noise():
            result = run(args)
    except DemoError as error:
        print(f"{PROG}: error: {error}", file=sys.stderr)
        return error.exit_code
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        _print_text(result)
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
