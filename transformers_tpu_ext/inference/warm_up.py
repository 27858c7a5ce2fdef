"""Batch inference's warm-up: every bucket of a model, pipeline, sentence-transformers model or lm-eval ``HFLM``
compiled ahead (``transformers_tpu_ext.warmup(target, work="infer", max_length=..., max_batch_size=...)``).

Each (row bucket, length bucket) pair up to ``max_batch_size`` rows and ``max_length`` tokens runs once
through the very path the user's calls take, shortest first (so each pair pads to its own bucket, and
later calls find every bucket already run):

- a text pipeline (:data:`~.policy.PIPELINES`): the pipeline itself, on a text of the bucket's length
  repeated over the rows (a fill-mask text ends with the mask token), with the call's own options
  (``top_k``, ``candidate_labels``...);
- a ``SentenceTransformer``: ``encode()`` of such texts;
- an lm-eval ``HFLM``: ``_model_call`` of a batch of token ids, as its ``loglikelihood`` calls it;
- a model: ``model(**inputs)`` inside ``bucketed(model)``, under ``torch.no_grad``, with the inputs a
  tokenizer gives (``tokenizer=``; else ``input_ids`` and ``attention_mask``) and the call's options.

The recompile guard counts the work ``infer`` of the model as warmed up afterwards. Off TPU it does nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..compilation import recompile
from ..core.progress import Progress
from ..ladders import round_up
from . import policy

__all__ = ["infer_buckets", "warmup_infer"]


def infer_buckets(max_length: int, max_batch_size: int = 1, batch_sizes: Any = None,
                  max_positions: int | None = None) -> list[tuple[int, int]]:
    """The (rows, length) buckets a warm-up runs: every row rung up to ``max_batch_size`` (or the rungs of
    ``batch_sizes``) times every length rung up to ``max_length`` (never past ``max_positions``)."""
    if max_length < 1 or max_batch_size < 1:
        raise ValueError("warmup(work='infer') needs max_length and max_batch_size >= 1")
    rows_ladder = policy.row_ladder()
    if batch_sizes:
        rows = sorted({round_up(int(size), rows_ladder) for size in batch_sizes})
    else:
        rows = [r for r in rows_ladder if r <= round_up(max_batch_size, rows_ladder)]
    ladder = policy.sequence_ladder()
    top = round_up(max_length, ladder)
    lengths = [rung for rung in ladder if rung <= top]
    if max_positions is not None:
        lengths = sorted({min(rung, max_positions) for rung in lengths})
    return [(r, n) for r in rows for n in lengths]


def _kind(target: Any) -> str:
    names = {cls.__name__ for cls in type(target).__mro__}
    if "Pipeline" in names:
        return "pipeline"
    if "SentenceTransformer" in names:
        return "encoder"
    if "HFLM" in names:
        return "lm_eval"
    return "model"


def _model(target: Any, kind: str) -> Any:
    return {"pipeline": lambda: target.model, "lm_eval": lambda: target.model}.get(kind, lambda: target)()


def _text(count: Any, length: int, floor: int, word: str, suffix: str = "") -> str:
    """Words ``word`` repeated until ``count(text)`` passes ``floor`` tokens (at most ``length``; a text the
    tokenizer truncates stops growing)."""
    words, text = 1, (word + suffix).strip()
    tokens = count(text)
    while tokens <= floor and tokens < length:
        longer = (" ".join([word] * (words + 1)) + suffix).strip()
        more = count(longer)
        if more <= tokens:
            break
        words, text, tokens = words + 1, longer, more
    return text


def _word(tokenizer: Any) -> str:
    special = set(getattr(tokenizer, "all_special_tokens", []) or [])
    vocab = tokenizer.get_vocab() if hasattr(tokenizer, "get_vocab") else {}
    for word in ("the", "a", "hello", "tpu", *sorted(vocab)):
        if word.isalpha() and word not in special and len(tokenizer(word, add_special_tokens=False)["input_ids"]) == 1:
            return word
    return "a"


def _max_positions(model: Any) -> int | None:
    from .facts import model_facts

    try:
        return model_facts(model).max_positions
    except Exception:  # noqa: BLE001
        return None


def warmup_infer(target: Any, *, max_length: int, max_batch_size: int = 8, batch_sizes: Any = None,
                 tokenizer: Any = None, **call: Any) -> list[tuple[int, int]]:
    """Compile every (rows, length) bucket of ``target`` up to ``max_batch_size`` rows and ``max_length``
    tokens (see the module); returns the buckets run. ``call``: the options the service passes to each call."""
    from ..backend import DEVICE_TYPE

    kind = _kind(target)
    model = _model(target, kind)
    try:
        device = next(model.parameters()).device.type
    except (StopIteration, AttributeError):
        device = None
    top = getattr(target, "max_seq_length", None) if kind == "encoder" else _max_positions(model)
    buckets = infer_buckets(max_length, max_batch_size, batch_sizes, top)
    if device != DEVICE_TYPE:
        return []
    covered = {"max_length": max(n for _, n in buckets), "max_batch_size": max(r for r, _ in buckets)}
    runner = {"pipeline": _pipeline, "encoder": _encoder, "lm_eval": _lm_eval, "model": _plain}[kind]
    with recompile.warming_up("infer", model if kind != "encoder" else target, covered), \
            Progress(len(buckets), desc="warmup", unit="bucket") as progress:
        step = runner(target, tokenizer, call)
        floors = {}
        for rows, length in buckets:
            floor = floors.get(rows, 0)
            step(rows, length, floor)
            floors[rows] = length
            progress.step(f"compiled {rows} x {length} tokens")
    return buckets


def _pipeline(pipe: Any, tokenizer: Any, call: Mapping[str, Any]) -> Any:
    tokenizer = tokenizer or pipe.tokenizer
    preprocess, _, _ = pipe._sanitize_parameters(**call)
    mask = getattr(tokenizer, "mask_token", None) if type(pipe).__name__ == "FillMaskPipeline" else None
    word = _word(tokenizer)

    def count(text: str) -> int:
        out = pipe.preprocess(text, **preprocess)
        first = out if isinstance(out, Mapping) else next(iter(out))
        return int(first["input_ids"].shape[-1])

    def step(rows: int, length: int, floor: int) -> None:
        text = _text(count, length, floor, word, f" {mask}" if mask else "")
        pipe([text] * rows, batch_size=rows, **call)

    return step


def _encoder(model: Any, tokenizer: Any, call: Mapping[str, Any]) -> Any:
    import torch

    tokenizer = tokenizer or model.tokenizer
    word = _word(tokenizer)

    def count(text: str) -> int:
        return int(model.tokenize([text])["input_ids"].shape[-1])

    def step(rows: int, length: int, floor: int) -> None:
        text = _text(count, length, floor, word)
        with torch.no_grad():  # encode() runs under inference mode itself
            model.encode([text] * rows, batch_size=rows, **call)

    return step


def _token(model: Any) -> int:
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    special = {getattr(config, name, None) for name in ("pad_token_id", "bos_token_id", "eos_token_id")}
    return next(t for t in range(3, 1 << 20) if t not in special)


def _lm_eval(lm: Any, tokenizer: Any, call: Mapping[str, Any]) -> Any:
    import torch

    token = _token(lm.model)

    def step(rows: int, length: int, floor: int) -> None:
        lm._model_call(torch.full((rows, length), token, dtype=torch.long))

    return step


def _plain(model: Any, tokenizer: Any, call: Mapping[str, Any]) -> Any:
    import torch

    from .runtime import bucketed

    keys = tuple(tokenizer("a", return_tensors="pt").keys()) if tokenizer is not None else ("input_ids", "attention_mask")
    token = _token(model)

    def step(rows: int, length: int, floor: int) -> None:
        inputs = {k: torch.full((rows, length), token if k == "input_ids" else (1 if k == "attention_mask" else 0),
                                dtype=torch.long) for k in keys if k in policy.PADDING}
        with bucketed(model), torch.no_grad():
            model(**inputs, **call)

    return step
