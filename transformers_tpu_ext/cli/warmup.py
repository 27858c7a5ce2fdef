"""``transformers-tpu warmup MODEL``: compile every bucket of the chosen work ahead of time.

For a container build or a CI step on a TPU VM: the programs land in torch_tpu's persistent compile
cache (set up by the plugin, ``docs/compile-cache.md``), and the service or training run that starts
next with the same cache directory loads them instead of compiling. The works:

- generate (``--max-prompt-length`` and ``--max-new-tokens``; ``--max-batch-size`` or ``--batch-sizes``;
  ``--do-sample``): ``warmup(model, ...)``'s buckets;
- ``--serve``: every continuous-batching step shape (serving settings from ``TRANSFORMERS_TPU_EXT_SERVE_*``);
- ``--infer MAX_LENGTH`` (``--task``, ``--max-batch-size`` or ``--batch-sizes``): every padded forward's
  bucket of the pipeline ``--task`` (``pipeline(TASK, model=MODEL, device="tpu")``, default
  ``feature-extraction``) up to ``MAX_LENGTH`` tokens: ``warmup(pipe, work="infer", ...)``;
- ``--train MAX_LENGTH``: one training step per sequence bucket up to ``MAX_LENGTH`` with a plain
  ``Trainer`` (causal-LM batches of ``input_ids``, ``attention_mask`` and ``labels``; AdamW;
  ``--train-batch-size`` per device; ``--bf16``). Another training set-up: call
  ``warmup(trainer, work="train", ...)`` in your own script once.

The model loads with ``device_map="auto"`` and ``--dtype`` (the programs are those of that dtype).
Each work shows its progress; the last line counts the programs (``--json``: one object). A bad
option, option pair or setting is one error line before the model loads; a failure while warming up
is one line too (:mod:`.running`).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import tempfile
import time
from typing import Any

from . import running
from .args import DTYPES, CommandError, Parser, check_settings, dtype, int_list, parse, positive_int
from .models import resolve_model

PROG = "transformers-tpu warmup"
#: The pipeline tasks ``--infer`` warms up (the text tasks ``inference.policy.PIPELINES`` pads).
INFER_TASKS = ("feature-extraction", "text-classification", "token-classification", "fill-mask")


class WarmupError(CommandError):
    """A request that cannot work; ``str()`` says what to do."""


def _sizes(text: str) -> list[int]:
    return int_list(text, what="batch sizes")


def _parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog=PROG,
        description="Compile every bucket of the chosen work into the persistent compile cache, ahead of time.",
    )
    parser.add_argument("model", metavar="MODEL", help="a local model directory or a Hub id")
    generate = parser.add_argument_group("generate()")
    generate.add_argument("--max-prompt-length", type=positive_int, help="longest prompt, in tokens")
    generate.add_argument("--max-new-tokens", type=positive_int, help="largest max_new_tokens")
    sizes = generate.add_mutually_exclusive_group()
    sizes.add_argument("--max-batch-size", type=positive_int,
                       help="largest batch (every batch bucket up to it; default 1, --infer: 8)")
    sizes.add_argument("--batch-sizes", type=_sizes, help="exactly these batch sizes, e.g. 1,4,8 (a sampling service)")
    generate.add_argument("--do-sample", action="store_true", help="the service samples (its choice graph is per batch size)")
    parser.add_argument("--serve", action="store_true", help="every continuous-batching step shape")
    infer = parser.add_argument_group("batch inference")
    infer.add_argument("--infer", type=positive_int, metavar="MAX_LENGTH",
                       help="every padded forward's bucket up to MAX_LENGTH tokens (pipelines, encode(), lm-eval)")
    infer.add_argument("--task", help=f"the pipeline --infer warms up: {', '.join(INFER_TASKS)} (default feature-extraction)")
    train = parser.add_argument_group("training")
    train.add_argument("--train", type=positive_int, metavar="MAX_LENGTH", help="training steps of every bucket up to MAX_LENGTH tokens")
    train.add_argument("--train-batch-size", type=positive_int, help="per-device batch size (default 8)")
    train.add_argument("--bf16", action="store_true", help="train in bf16 (TrainingArguments(bf16=True))")
    parser.add_argument("--dtype", type=dtype, default="auto", help=f"dtype the model loads in: {', '.join(DTYPES)} (default: auto, the checkpoint's)")
    parser.add_argument("--json", action="store_true", help="print one JSON object at the end")
    return parser


def check(args: argparse.Namespace) -> None:
    """Raise :class:`WarmupError` for options that cannot work together (the values' types are the parser's)."""
    generate = args.max_prompt_length is not None or args.max_new_tokens is not None
    if generate and (args.max_prompt_length is None or args.max_new_tokens is None):
        raise WarmupError("generate() needs both --max-prompt-length and --max-new-tokens")
    infer = args.infer is not None
    if not (generate or args.serve or args.train is not None or infer):
        raise WarmupError("choose the work: --max-prompt-length and --max-new-tokens (generate), --serve, --train MAX_LENGTH, "
                          "--infer MAX_LENGTH")
    if args.task is not None and not infer:
        raise WarmupError("--task applies to --infer MAX_LENGTH: add it, or drop --task")
    if infer and args.task is None:
        args.task = "feature-extraction"
    if infer and args.task not in INFER_TASKS:
        raise WarmupError(f"--task {args.task!r} is not a pipeline --infer warms up: choose from {', '.join(INFER_TASKS)}")
    if infer and (generate or args.serve or args.train is not None):
        raise WarmupError("--infer loads the model for its pipeline task: warm it up in a command of its own")
    if not generate and not infer:
        given = [option for option, value in (("--max-batch-size", args.max_batch_size), ("--batch-sizes", args.batch_sizes))
                 if value is not None]
        if given:
            raise WarmupError(f"{given[0]} sizes the generate() work: add --max-prompt-length and --max-new-tokens, or drop it")
    if args.do_sample and not (generate or args.serve):
        raise WarmupError("--do-sample applies to generate() and --serve: add one of them, or drop it")
    if args.train is None:
        given = [option for option, value in (("--train-batch-size", args.train_batch_size), ("--bf16", args.bf16)) if value]
        if given:
            raise WarmupError(f"{given[0]} applies to --train MAX_LENGTH: add it, or drop {given[0]}")
    if args.max_batch_size is None:
        args.max_batch_size = 8 if infer else 1
    if args.train_batch_size is None:
        args.train_batch_size = 8
    check_settings()


def _counts() -> dict[str, Any]:
    from transformers_tpu_ext import testing
    from transformers_tpu_ext.compilation import persistent

    counts: dict[str, Any] = {"backend": persistent.process_stats()}
    sim = testing.simulated_tpu()
    if sim is not None:
        counts["simulated"] = sim.counters().asdict()
    return counts


def _difference(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    if before.get("backend") and after.get("backend"):
        result["new_programs"] = after["backend"]["misses"] - before["backend"]["misses"]
    if before.get("simulated") and after.get("simulated"):
        b, a = before["simulated"], after["simulated"]
        result["compiled"] = (a["graphs_compiled"] + a["eager_programs"]) - (b["graphs_compiled"] + b["eager_programs"])
        result["loaded"] = a["programs_loaded"] - b["programs_loaded"]
    return result


def _load(args: argparse.Namespace) -> Any:
    resolve_model(args.model, option="MODEL")
    import torch  # noqa: F401 - activates the plugin (and torch_tpu, or the simulated TPU) through entry points

    import transformers_tpu_ext  # noqa: F401 - in case entry points are disabled
    from transformers_tpu_ext import backend

    if not backend.tpu_available():
        raise WarmupError(
            "no TPU is seen here: run it on the TPU VM that will serve or train (on a machine without a TPU, "
            "TRANSFORMERS_TPU_EXT_SIMULATE=1 tries it on the simulated TPU)",
            exit_code=1,
        )
    if args.infer is not None:
        from transformers import pipeline

        return pipeline(args.task, model=args.model, dtype=args.dtype, device=backend.DEVICE_TYPE)
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(args.model, dtype=args.dtype, device_map="auto")


def _infer(pipe: Any, args: argparse.Namespace) -> dict[str, Any]:
    from transformers_tpu_ext.inference.warm_up import warmup_infer

    buckets = warmup_infer(pipe, max_length=args.infer, max_batch_size=args.max_batch_size if args.batch_sizes is None else 1,
                           batch_sizes=args.batch_sizes)
    return {"task": args.task, "buckets": [list(bucket) for bucket in buckets]}


def _generate(model: Any, args: argparse.Namespace) -> dict[str, Any]:
    from transformers_tpu_ext.generation.warm_up import warmup_generate

    options: dict[str, Any] = {"do_sample": True} if args.do_sample else {}
    plans = warmup_generate(
        model,
        max_prompt_length=args.max_prompt_length,
        max_new_tokens=args.max_new_tokens,
        max_batch_size=args.max_batch_size if args.batch_sizes is None else 1,
        batch_sizes=args.batch_sizes,
        **options,
    )
    return {"buckets": [list(plan) for plan in plans]}


def serve_generation_config(model: Any, do_sample: bool = False) -> Any:
    """The generation config ``transformers serve`` builds its continuous-batching manager from for a
    request that sets no sampling option: the model's own (a copy; Qwen3's and Llama-3-Instruct's
    sample), without the model's KV cache (the manager pages its own). ``do_sample`` forces sampling."""
    import copy

    config = copy.deepcopy(model.generation_config)
    if config.max_new_tokens is None or config.max_new_tokens < 1024:
        config.max_new_tokens = 1024
    if do_sample:
        config.do_sample = True
    config.use_cache = False
    return config


def _serve(model: Any, args: argparse.Namespace) -> dict[str, Any]:
    from transformers_tpu_ext.serving.warm_up import warmup_serve

    manager = warmup_serve(model, generation_config=serve_generation_config(model, do_sample=args.do_sample))
    plan = getattr(manager.continuous_batching_config, "tpu_plan", None)
    shapes = [list(shape) for shape in getattr(plan, "shapes", ())]
    try:
        manager.destroy()
    except Exception:  # noqa: BLE001 - never started: nothing to stop
        pass
    return {"shapes": shapes}


def _train(model: Any, args: argparse.Namespace, workdir: str) -> dict[str, Any]:
    import torch
    from transformers import Trainer, TrainingArguments, default_data_collator

    from transformers_tpu_ext.training.warm_up import warmup_train

    vocab = int(model.config.get_text_config().vocab_size)
    generator = torch.Generator().manual_seed(0)
    rows = []
    for _ in range(max(args.train_batch_size, 2)):
        ids = torch.randint(2, max(3, vocab), (args.train,), generator=generator).tolist()
        rows.append({"input_ids": ids, "attention_mask": [1] * len(ids), "labels": ids})
    training_args = TrainingArguments(
        output_dir=workdir,
        per_device_train_batch_size=args.train_batch_size,
        max_steps=1,
        report_to="none",
        save_strategy="no",
        logging_strategy="no",
        bf16=args.bf16,
        disable_tqdm=True,
    )
    trainer = Trainer(model=model, args=training_args, train_dataset=rows, data_collator=default_data_collator)
    callback = warmup_train(trainer, max_length=args.train)
    trainer.train()
    return {"lengths": list(callback.lengths)}


def run(args: argparse.Namespace) -> dict[str, Any]:
    check(args)
    model = _load(args)
    from transformers_tpu_ext.compilation import persistent

    cache = persistent.report()
    if cache["root"] is None:
        print(
            f"{PROG}: the persistent compile cache is off ({cache['reason']}): the programs compiled now are not kept "
            "for the next process",
            file=sys.stderr,
        )
    result: dict[str, Any] = {"model": args.model, "cache": cache["root"], "works": {}}
    before = _counts()
    start = time.perf_counter()
    if args.infer is not None:
        result["works"]["infer"] = _infer(model, args)
    if args.max_prompt_length is not None:
        result["works"]["generate"] = _generate(model, args)
    if args.train is not None:
        with tempfile.TemporaryDirectory() as workdir:
            result["works"]["train"] = _train(model, args, workdir)
    if args.serve:  # last: a manager that never starts leaves the model on its paged attention
        result["works"]["serve"] = _serve(model, args)
    result["seconds"] = round(time.perf_counter() - start, 1)
    result["programs"] = _difference(before, _counts())
    after = persistent.report()
    result["cache_entries"] = after.get("entries")
    return result


def _summary(result: dict[str, Any]) -> str:
    works = result["works"]
    parts = []
    if "generate" in works:
        parts.append(f"generate: {len(works['generate']['buckets'])} buckets")
    if "serve" in works:
        parts.append(f"serve: {len(works['serve']['shapes'])} step shapes")
    if "infer" in works:
        parts.append(f"infer ({works['infer']['task']}): {len(works['infer']['buckets'])} buckets")
    if "train" in works:
        parts.append(f"train: {len(works['train']['lengths'])} sequence buckets")
    programs = result["programs"]
    if "compiled" in programs:
        counted = f"{programs['compiled']} programs compiled, {programs['loaded']} loaded from the cache"
    elif "new_programs" in programs:
        counted = f"{programs['new_programs']} programs compiled or loaded from the cache"
    else:
        counted = "programs not counted by this backend"
    where = f"cache {result['cache']} ({result['cache_entries']} entries)" if result["cache"] else "no persistent cache"
    return f"warmup done in {result['seconds']} s: {'; '.join(parts)}; {counted}; {where}"


def main(argv: list[str] | None = None) -> int:
    args = parse(_parser(), argv)
    if isinstance(args, int):  # --help, or a usage error (already said)
        return args

    def work() -> int:
        # stdout carries the result only: what the libraries print while working (the Trainer's
        # metrics) goes to stderr, with the progress bars, so `--json` output parses.
        with contextlib.redirect_stdout(sys.stderr):
            result = run(args)
        print(json.dumps(result, indent=2) if args.json else _summary(result))
        return 0

    return running.run(PROG, work)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
