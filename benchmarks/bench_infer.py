"""Batch inference on the simulated TPU, with and without transformers-tpu-ext, in one run.

    python benchmarks/bench_infer.py                 # 200 texts per workload (a few minutes on 2 cores)
    python benchmarks/bench_infer.py --quick         # 40 texts (tests/inference/test_inference_benchmark.py)
    python benchmarks/bench_infer.py --texts 1000 --output benchmarks/results/infer.json

Workloads (tiny context-sensitive models built from configs, ``initializer_range=0.3``; texts of 1 to
30 random words, seeded; batch size 8): the pipelines ``text-classification`` (a BERT and a
Qwen3-shaped decoder classifier), ``token-classification``, ``feature-extraction``, ``fill-mask``,
``zero-shot-classification`` (2 labels), and ``model_loop``: ``model(**batch)`` of a BERT encoder
over tokenized batches left on the CPU, mean-pooled on the host (the plugin side inside
``bucketed(model)``); ``lm_eval`` (named only, it needs the ``lm-eval`` extra): lm-eval's ``HFLM``
``loglikelihood`` of a tiny Qwen3 over requests made of each text (its last word the continuation),
plain: ``HFLM(pretrained=<the model on the TPU>)`` (lm-eval 0.4 takes no ``device="tpu"``), plugin:
``HFLM(pretrained=<path>, device="tpu")``; ``encode`` (named only, the ``embeddings`` extra):
``SentenceTransformer(<the tiny BERT>, device="tpu").encode(texts, batch_size=8)`` with mean pooling
and normalisation, nothing else (its ``torch.inference_mode()`` decorator taken off: the simulated TPU
cannot slice a tensor made outside it, with or without the plugin); ``audio_classification``: the
pipeline over clips of 200 to 3,000 random samples (a tiny wav2vec2, ``feat_extract_norm="layer"``,
the feature extractor's defaults: no mask), ``image_classification`` (named only, the ``vision``
extra): the pipeline over requests of 1 to 12 random images of random sizes (a tiny ViT; the
processor resizes them to 32 x 32), batch size 8 within a request. Each side runs in its own subprocess, one per workload (patches are process-global, and a program compiled for
one workload would be reused by the next):

- ``plain``: plain Transformers 5.24 (``TRANSFORMERS_TPU_EXT_DISABLE=1``), ``device="tpu"``;
- ``plugin``: transformers-tpu-ext, defaults.

Printed JSON, per side and workload: programs compiled (graphs + eager per-shape programs) and
host<->device bytes in the first and the second half of the texts, and the largest difference from
plain Transformers on the CPU (``max_abs_diff``; labels compared exactly: ``labels_match``); per batch of
the second half (steady state): ``graph_calls_per_batch``, ``eager_ops_per_batch`` (each a launch of its own
program and an HBM round trip on a chip) and ``programs_per_batch``. Plugin side, text workloads:
``roofline`` (texts/s per chip generation at the larger of the padded batches' FLOPs over peak bf16 FLOP/s and
their HBM bytes over HBM bandwidth, ``quantization.capacity.CHIPS``; one compiled program per batch assumed, as
the plugin runs it) and ``padding_waste`` (tokens computed over real tokens of the second half: the plugin's
shapes, and the batches' own lengths under each bucket ladder).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from _common import emit, run_worker, worker_env, write_report

HERE = Path(__file__).resolve().parent
BATCH = 8
WORKLOADS = ("text_classification", "decoder_classifier", "token_classification", "feature_extraction", "fill_mask",
             "zero_shot", "model_loop", "audio_classification")
#: Workloads that need an optional extra, run only when named (``--workloads lm_eval``).
EXTRA_WORKLOADS = ("lm_eval", "encode", "image_classification")
#: Image and audio workloads: their inputs are images or clips, not texts (``_media``).
MEDIA_WORKLOADS = ("image_classification", "audio_classification")


# -------------------------------------------------------------------------------------------------
# Worker side


def _numbers(value, out):
    """Every number of a pipeline result, in order; strings (labels, words) apart."""
    if isinstance(value, dict):
        for key in value:
            _numbers(value[key], out)
    elif isinstance(value, (list, tuple)):
        for item in value:
            _numbers(item, out)
    elif isinstance(value, str):
        out[1].append(value)
    elif hasattr(value, "tolist"):
        _numbers(value.tolist(), out)
    else:
        out[0].append(float(value))
    return out


def _compare(got, expected) -> dict:
    a, b = _numbers(got, ([], [])), _numbers(expected, ([], []))
    same = len(a[0]) == len(b[0]) and a[1] == b[1]
    diff = max((abs(x - y) for x, y in zip(a[0], b[0])), default=0.0) if same else None
    return {"labels_match": same, "max_abs_diff": diff}


def _workload(name: str):
    """(pipeline task or None, model factory, tokenizer, texts transform, call kwargs)."""
    import torch
    from transformers import AutoModelForSequenceClassification

    from transformers_tpu_ext.testing import tiny
    from transformers_tpu_ext.testing.tiny_encoders import tiny_bert_tokenizer, tiny_encoder

    def decoder():
        torch.manual_seed(0)
        return AutoModelForSequenceClassification.from_config(tiny.tiny_config("qwen3", num_labels=3, pad_token_id=0)).eval()

    bert = tiny_bert_tokenizer()
    same = lambda texts: texts  # noqa: E731
    return {
        "text_classification": ("text-classification", lambda: tiny_encoder("sequence_classification"), bert, same, {"top_k": None}),
        "decoder_classifier": ("text-classification", decoder, tiny.tiny_tokenizer(), lambda t: [s[:60] for s in t], {"top_k": None}),
        "token_classification": ("token-classification", lambda: tiny_encoder("token_classification"), bert, same, {}),
        "feature_extraction": ("feature-extraction", lambda: tiny_encoder("base"), bert, same, {}),
        "fill_mask": ("fill-mask", lambda: tiny_encoder("masked_lm"), bert, lambda t: [f"{s} [MASK] tpu" for s in t], {}),
        "zero_shot": ("zero-shot-classification", lambda: tiny_encoder("sequence_classification"), bert, same,
                      {"candidate_labels": ["cake", "tpu"]}),
        "model_loop": (None, lambda: tiny_encoder("base"), bert, same, {}),
        "lm_eval": (None, None, None, same, {}),
        "encode": (None, None, None, same, {}),
        "image_classification": (None, None, None, same, {}),
        "audio_classification": (None, None, None, same, {}),
    }[name]


def _loop(model, tokenizer, texts, plugin: bool):
    import torch

    results = []
    context = __import__("transformers_tpu_ext.inference", fromlist=["bucketed"]).bucketed(model) if plugin else None
    with (context if context is not None else torch.no_grad()), torch.no_grad():
        for start in range(0, len(texts), BATCH):
            batch = dict(tokenizer(texts[start:start + BATCH], padding=True, return_tensors="pt"))
            if model.device.type != "cpu" and not plugin:
                batch = {k: v.to(model.device) for k, v in batch.items()}
            hidden = model(**batch).last_hidden_state.cpu()
            mask = batch["attention_mask"].cpu().unsqueeze(-1)
            results.extend(((hidden * mask).sum(1) / mask.sum(1)).tolist())
    return results


def _lm_eval(texts, plugin: bool, device: str):
    """A function running lm-eval's ``loglikelihood`` over requests of ``texts`` (the last word the continuation)."""
    import tempfile

    from lm_eval.api.instance import Instance
    from lm_eval.models.huggingface import HFLM
    from transformers import AutoModelForCausalLM

    from transformers_tpu_ext.testing import tiny

    path = tempfile.mkdtemp()
    tiny.save_tiny_model(path, "qwen3")
    if device == "cpu" or plugin:
        lm = HFLM(pretrained=path, device=device, batch_size=BATCH)
    else:
        lm = HFLM(pretrained=AutoModelForCausalLM.from_pretrained(path).to(device), tokenizer=path, batch_size=BATCH)

    def run(part):
        requests = [Instance("loglikelihood", {}, (t.rsplit(" ", 1)[0] if " " in t else "the", " " + t.split(" ")[-1]), i)
                    for i, t in enumerate(part)]
        return [list(r) for r in lm.loglikelihood(requests, disable_tqdm=True)]

    return lm, run


def _encode(plugin: bool, device: str):
    """A function running ``SentenceTransformer(..., device=device).encode`` (mean pooling, normalised)."""
    import inspect
    import tempfile

    import torch
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Normalize, Pooling, Transformer

    import transformers_tpu_ext as ext
    from transformers_tpu_ext.testing.tiny_encoders import tiny_bert_tokenizer, tiny_encoder

    if not getattr(SentenceTransformer.encode, "_bench_raw", False):  # once: the plugin (if on) wraps the raw methods
        active = ext.is_active()
        ext.deactivate()
        for name in ("encode", "_inference"):
            raw = inspect.unwrap(SentenceTransformer.__dict__[name])
            setattr(SentenceTransformer, name, raw)
        SentenceTransformer.encode._bench_raw = True
        if active:
            ext.activate()
    path = tempfile.mkdtemp()
    tiny_encoder("base").save_pretrained(path)
    tiny_bert_tokenizer().save_pretrained(path)
    model = SentenceTransformer(modules=[Transformer(path, max_seq_length=64), Pooling(32, pooling_mode="mean"), Normalize()],
                                device=device).eval()

    def run(part):
        with torch.no_grad():
            return model.encode(part, batch_size=BATCH).tolist()

    return model, run


def _media(name: str, count: int):
    """(inputs, a function running the pipeline on a part of them on ``device``) of an image or audio workload."""
    from transformers import Wav2Vec2FeatureExtractor, pipeline

    from transformers_tpu_ext.testing import tiny_media

    if name == "audio_classification":
        inputs = tiny_media.clips(count, seed=1)

        def make(device):
            pipe = pipeline("audio-classification", model=tiny_media.tiny_audio_classifier("wav2vec2", "layer"),
                            feature_extractor=Wav2Vec2FeatureExtractor(), device=device)
            return pipe, lambda part: pipe(part, batch_size=BATCH, top_k=3)
    else:
        inputs = tiny_media.images(count, seed=1)

        def make(device):
            pipe = pipeline("image-classification", model=tiny_media.tiny_vit(), image_processor=tiny_media.image_processor(),
                            device=device)
            seeds = iter(range(1, 1 << 30))  # each half its own requests (the same on the CPU)
            return pipe, lambda part: [row for request in tiny_media.requests(part, seed=next(seeds))
                                       for row in pipe(request, batch_size=BATCH, top_k=4)]
    return inputs, make


LADDERS = {
    "none (each batch at its longest, plain)": None,
    "training ladder (16, 32, 48, 64, 96...; the plugin's)": "sequence",
    "powers of two (min 16)": "pow2",
    "multiples of 128": "m128",
}


def _ladder(name):
    from transformers_tpu_ext.inference.policy import sequence_ladder

    kind = LADDERS[name]
    if kind == "sequence":
        return sequence_ladder()
    if kind == "pow2":
        return tuple(1 << i for i in range(4, 20))
    if kind == "m128":
        return tuple(range(128, 1 << 17, 128))
    return None


def _padding_waste(lengths: list[int]) -> dict:
    """Tokens computed over real tokens for the texts' token counts in batches of BATCH, under each ladder."""
    from transformers_tpu_ext.inference.compile_policy import padding_waste
    from transformers_tpu_ext.inference.policy import row_ladder
    from transformers_tpu_ext.ladders import round_up

    out = {}
    for name in LADDERS:
        ladder, padded = _ladder(name), 0
        for start in range(0, len(lengths), BATCH):
            batch = lengths[start:start + BATCH]
            rows = len(batch) if ladder is None else round_up(len(batch), row_ladder())
            padded += rows * (max(batch) if ladder is None else round_up(max(batch), ladder))
        out[name] = padding_waste(sum(lengths), padded)
    return out


def _roofline(model, shapes: dict, texts: int) -> dict:
    """Texts/s per chip generation if each padded batch is one program bound by the larger of its FLOPs over the
    chip's peak bf16 FLOP/s and its HBM bytes (bf16 weights once, the batch's activations in and out of each
    layer) over the HBM bandwidth."""
    from transformers_tpu_ext.quantization.capacity import CHIPS

    config = model.config
    layers, hidden = config.num_hidden_layers, config.hidden_size
    embeddings = sum(p.numel() for n, p in model.named_parameters() if "embed" in n)
    dense = sum(p.numel() for p in model.parameters()) - embeddings
    flops = bytes_ = 0.0
    batches = []
    for (rows, length), calls in shapes.items():
        f = 2.0 * dense * rows * length + 4.0 * layers * rows * length * length * hidden
        b = 2.0 * sum(p.numel() for p in model.parameters()) + 2.0 * 2 * layers * rows * length * hidden
        batches.append((f, b, calls))
        flops, bytes_ = flops + f * calls, bytes_ + b * calls
    rates = {}
    for generation, chip in CHIPS.items():
        seconds = sum(calls * max(f / chip.bf16_flops, b / chip.bandwidth) for f, b, calls in batches)
        rates[generation] = round(texts / seconds, 1) if seconds else None
    return {"flops": flops, "hbm_bytes": bytes_, "texts_per_s": rates}


def worker(side: str, texts_count: int, workloads: list[str]) -> None:
    import torch

    from transformers_tpu_ext import testing

    sim = testing.install(chips=1)
    torch.set_num_threads(1)
    from transformers import pipeline

    from transformers_tpu_ext.testing.tiny_encoders import random_texts

    plugin = side == "plugin"
    report = {}
    for name in workloads:
        task, make, tokenizer, transform, call = _workload(name)
        texts = transform(random_texts(texts_count, seed=1, longest=30))
        half = len(texts) // 2
        if name == "lm_eval":
            expected = _lm_eval(texts, plugin, "cpu")[1](texts)
            lm, run = _lm_eval(texts, plugin, "tpu")
            model = lm.model
        elif name == "encode":
            expected = _encode(plugin, "cpu")[1](texts)
            model, run = _encode(plugin, "tpu")
        elif name in MEDIA_WORKLOADS:
            texts, make_pipe = _media(name, texts_count)
            cpu_run = make_pipe("cpu")[1]
            expected = cpu_run(texts[:half]) + cpu_run(texts[half:])
            pipe, run = make_pipe("tpu")
            task = name
        elif task is None:
            expected = _loop(make(), tokenizer, texts, plugin=False)
            model = make().to("tpu")
            run = lambda part: _loop(model, tokenizer, part, plugin)  # noqa: E731
        else:
            cpu = pipeline(task, model=make(), tokenizer=tokenizer, device="cpu")
            # the same two calls: feature-extraction's vectors include the pipeline's own padding of each batch
            expected = cpu(texts[:half], batch_size=BATCH, **call) + cpu(texts[half:], batch_size=BATCH, **call)
            pipe = pipeline(task, model=make(), tokenizer=tokenizer, device="tpu")
            run = lambda part: pipe(part, batch_size=BATCH, **call)  # noqa: E731
        start = time.perf_counter()
        before = sim.counters()
        got = run(texts[:half])
        shapes_first = {}
        if plugin and name not in MEDIA_WORKLOADS:
            from transformers_tpu_ext.inference import runtime as _runtime

            probe = model if task is None or name in ("lm_eval", "encode") else pipe.model
            shapes_first = dict(_calls(name, task, probe, _runtime).shapes)
        middle = sim.counters()
        got = got + run(texts[half:])
        after = sim.counters()
        first, second = middle - before, after - middle
        batches = sum(1 for _ in range(0, len(texts) - half, BATCH))
        report[name] = {
            "graph_calls_per_batch": round(second.graph_calls / batches, 2),
            "eager_ops_per_batch": round(second.eager_ops / batches, 2),
            "programs_per_batch": round(second.programs / batches, 2),
            "texts": len(texts),
            "programs_first_half": first.programs,
            "programs_second_half": second.programs,
            "h2d_bytes_first_half": first.h2d_bytes,
            "h2d_bytes_second_half": second.h2d_bytes,
            "d2h_bytes_first_half": first.d2h_bytes,
            "d2h_bytes_second_half": second.d2h_bytes,
            "wall_s": round(time.perf_counter() - start, 2),
            **_compare(got, expected),
        }
        if plugin:
            from transformers_tpu_ext.inference import runtime

            target = pipe.model if name in MEDIA_WORKLOADS else (model if task is None or name in ("lm_eval", "encode") else pipe.model)
            calls = _calls(name, task, target, runtime)
            report[name].update(padded_calls=calls.padded, compiled_calls=calls.compiled, unpadded=calls.reasons,
                                not_compiled=calls.eager_reasons, lengths=sorted(calls.used), rows=sorted(calls.used_rows))
            if name not in MEDIA_WORKLOADS and tokenizer is not None:
                shapes = {k: v - shapes_first.get(k, 0) for k, v in calls.shapes.items() if v - shapes_first.get(k, 0)}
                real = [len(tokenizer(t)["input_ids"]) for t in texts[half:]]
                padded = sum(r * n * c for (r, n), c in shapes.items())
                from transformers_tpu_ext.inference.compile_policy import padding_waste

                report[name]["padding_waste"] = {"plugin (padded tokens / real tokens)": padding_waste(sum(real), padded),
                                                 **_padding_waste(real)}
                inner = calls.module
                report[name]["roofline"] = _roofline(inner, shapes, len(texts) - half)
    emit(report)


def _calls(name, task, target, runtime):
    """The plugin's ``Bucketed`` of a workload (the one its patch or ``bucketed()`` used)."""
    if name == "encode":
        from transformers_tpu_ext.inference import bucketed

        return bucketed(target)
    if name in MEDIA_WORKLOADS:
        from transformers_tpu_ext.inference.media_calls import MediaCalls

        return runtime.for_model(target, drop_cache=True, kind=MediaCalls)
    options = {"positional_ids": True} if name == "lm_eval" else {}
    return runtime.for_model(target, drop_cache=task is not None or name == "lm_eval", **options)


# -------------------------------------------------------------------------------------------------
# Driver


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="40 texts per workload")
    parser.add_argument("--texts", type=int, default=None, help="texts per workload (default 200)")
    parser.add_argument("--sides", default="plain,plugin")
    parser.add_argument("--workloads", default=",".join(WORKLOADS))
    parser.add_argument("--output", default=None)
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    count = args.texts or (40 if args.quick else 200)
    workloads = [w for w in args.workloads.split(",") if w]
    if args.worker:
        worker(args.worker, count, workloads)
        return 0
    report: dict = {"texts": count, "batch_size": BATCH, "sides": {}}
    for side in args.sides.split(","):
        # PYTHONPATH: the repository first, then the caller's (an extra installed elsewhere, e.g. lm-eval)
        path = os.pathsep.join(p for p in (str(HERE.parent), os.environ.get("PYTHONPATH", "")) if p)
        env = worker_env(TRANSFORMERS_TPU_EXT_DISABLE="1" if side == "plain" else None, PYTHONPATH=path)
        report["sides"][side] = {}
        for name in workloads:  # a process each: programs one workload compiled are not counted for the next
            report["sides"][side].update(run_worker(__file__, ["--worker", side, "--texts", str(count), "--workloads", name], env))
    if {"plain", "plugin"} <= set(report["sides"]):
        report["comparison"] = {
            name: {
                **{f"{side}_{key}": report["sides"][side][name][key] for side in ("plain", "plugin")
                   for key in ("programs_second_half", "graph_calls_per_batch", "eager_ops_per_batch", "programs_per_batch")},
            }
            for name in workloads
        }
    write_report(report, args.output)
    return 0


if __name__ == "__main__":
    sys.exit(main())
