"""Sampling parameters of continuous batching on TPU as data, not program constants (pure: no torch).

Transformers' continuous batching builds a manager's logits processors once, from its generation
config (``GenerationMixin._get_logits_processor``). By default (``ContinuousBatchingConfig(
per_request_processors=False)``) they are the ones of ``generate()``: ``TemperatureLogitsWarper``
divides by ``self.temperature``, a Python float, inside the compiled step; torch_tpu keys a program by
the Python numbers it holds, so a manager built with another temperature or top-p (``transformers
serve`` builds its manager from the first request's) compiles every step shape again, and a
``warmup --serve`` of the model's own config does not cover it. With ``per_request_processors=True``
upstream replaces them with its continuous-batching versions, which read temperature, top-k and
top-p from an int32 tensor of the step (one value per request: ``add_request(..., temperature=0.7)``).

:func:`per_request_path` decides when the plugin turns that on (a TPU-path manager that samples);
:func:`completed` adds the identity temperature (1.0) and top-p (1.0) processors the config leaves
out, so that the processors' *kinds*, the only thing left in the program, do not depend on the
sampling values: a first request with ``temperature=1.0`` or ``top_p=1.0`` runs the programs the
warm-up compiled. What the predicate does not recognise is handed to upstream untouched.

What differs from ``generate()``'s processors (``tests/serving/test_serving_sampling.py``):

- temperature and top-k: nothing (the same float32 division; the same k-th largest threshold);
- top-p: upstream computes ``1 - top_p`` in float32 from the float32 ``top_p``; ``generate()``
  computes it in float64 and rounds it to float32. The two thresholds differ by at most 2**-25
  (0.9: 0.100000024 vs 0.100000001): a token whose cumulative probability falls between them is
  kept by one and dropped by the other;
- the identity top-p (``top_p=1.0`` when the config has none) drops the tokens whose probability is
  exactly 0 in float32, which sampling never picks.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "BEGIN",
    "END",
    "AFTER_TEMPERATURE",
    "IDENTITY",
    "PER_REQUEST",
    "TAIL",
    "SamplingFacts",
    "completed",
    "per_request_path",
    "path_rows",
    "path_table",
]

#: Processors upstream has a per-request version of, with the request keyword each one reads.
PER_REQUEST = {"TemperatureLogitsWarper": "temperature", "TopKLogitsWarper": "top_k", "TopPLogitsWarper": "top_p"}
#: Sampling warpers ``_get_logits_processor`` appends after the temperature, in its order.
AFTER_TEMPERATURE = (
    "TopHLogitsWarper",
    "TopKLogitsWarper",
    "TopPLogitsWarper",
    "MinPLogitsWarper",
    "TypicalLogitsWarper",
    "EpsilonLogitsWarper",
    "EtaLogitsWarper",
)
#: Processors it appends after every warper (watermarks, the final normalization).
TAIL = ("WatermarkLogitsProcessor", "SynthIDTextWatermarkLogitsProcessor", "LogitNormalization")
#: The value each added processor holds (it changes no score: see the module docstring for top-p).
IDENTITY = {"TemperatureLogitsWarper": 1.0, "TopPLogitsWarper": 1.0}


@dataclass(frozen=True)
class SamplingFacts:
    """What the manager's ``__init__`` knows when it builds its logits processors (plain data)."""

    tpu_path: bool  # the manager takes the TPU serving path (policy.paged_path)
    do_sample: bool  # its generation config samples
    processors: tuple[str, ...] = ()  # class names of _get_logits_processor(generation_config), in order
    upstream_classes: bool = True  # every one of them is Transformers' own class (not a subclass of yours)


def per_request_path(facts: SamplingFacts) -> tuple[bool, str]:
    """``(True, why)`` if the plugin builds the manager's processors with ``per_request_processors=True``
    and the identity processors of :func:`completed`; else ``(False, why not)``: as upstream builds them."""
    if not facts.tpu_path:
        return False, "the manager is not on the TPU serving path (Transformers' processors, untouched)"
    if not facts.do_sample:
        return False, "greedy: no sampling parameter in the step (Transformers' processors, untouched)"
    if not facts.upstream_classes:
        return False, "a logits processor that is not Transformers' own class (Transformers' processors, untouched)"
    return True, "sampling: temperature, top-k and top-p are tensors of the step, one value per request"


def completed(processors: tuple[str, ...]) -> tuple[int | str, ...]:
    """The processor list the plugin builds: an ``int`` is the index of one of ``processors`` (kept, in
    order), a ``str`` the class of an identity processor added (:data:`IDENTITY`) where
    ``_get_logits_processor`` would have put it."""
    plan: list[int | str] = list(range(len(processors)))
    names = list(processors)
    if "TemperatureLogitsWarper" not in names:
        at = _first(names, AFTER_TEMPERATURE)
        at = _first(names, TAIL) if at is None else at
        at = len(names) if at is None else at
        plan.insert(at, "TemperatureLogitsWarper")
        names.insert(at, "TemperatureLogitsWarper")
    if "TopPLogitsWarper" not in names:
        before = ("TemperatureLogitsWarper", "TopHLogitsWarper", "TopKLogitsWarper")
        at = max(i for i, name in enumerate(names) if name in before) + 1
        plan.insert(at, "TopPLogitsWarper")
    return tuple(plan)


def _first(names: list[str], wanted: tuple[str, ...]) -> int | None:
    return next((i for i, name in enumerate(names) if name in wanted), None)


BEGIN = "<!-- generated: transformers_tpu_ext.serving.sampling.path_table() -->"
END = "<!-- end of generated table -->"

#: Generation configs a served model commonly has, for the docs table: (what, facts).
_ROWS = (
    ("a model whose generation config samples (Qwen3: temperature 0.6, top-k 20, top-p 0.95; Llama 3 Instruct)",
     SamplingFacts(True, True, ("TemperatureLogitsWarper", "TopKLogitsWarper", "TopPLogitsWarper"))),
    ("`do_sample=True`, `temperature=1.0`, `top_p=1.0` (a first request of `temperature=1, top_p=1`)",
     SamplingFacts(True, True, ("TopKLogitsWarper",))),
    ("a greedy generation config (`do_sample=False`, or a first request of `temperature=0`)",
     SamplingFacts(True, False, ())),
    ("a manager not on the TPU serving path (see the table above), or off TPU",
     SamplingFacts(False, True, ("TemperatureLogitsWarper",))),
)


def path_rows() -> list[tuple[str, str, str]]:
    """``(generation config, processors of the step, why)`` rows of docs/serving.md's sampling table."""
    rows = []
    for what, facts in _ROWS:
        taken, why = per_request_path(facts)
        if taken:
            plan = completed(facts.processors)
            names = [facts.processors[p] if isinstance(p, int) else f"{p}({IDENTITY[p]})" for p in plan]
            shown = "per request: " + ", ".join(_short(name) for name in names)
        else:
            shown = "Transformers': " + (", ".join(_short(name) for name in facts.processors) or "none (argmax)")
        rows.append((what, shown, why))
    return rows


def _short(name: str) -> str:
    return name.replace("LogitsWarper", "")


def path_table() -> str:
    """docs/serving.md's sampling table (``scripts/gen_docs_tables.py``)."""
    lines = ["| generation config of the manager | logits processors of the step | why |", "|---|---|---|"]
    lines += [f"| {what} | {shown} | {why} |" for what, shown, why in path_rows()]
    return "\n".join(lines)
