"""The recompile guard's decisions (pure): its settings, when a work is in steady state, what to say.

A *work* is what the guard watches, one call at a time, for one owner: ``generate`` (a ``generate()``
call of a model on the TPU), ``serve`` (a continuous-batching step of a model) and ``train`` (a training
step of a ``Trainer``); each owner has its own state (warming up model A says nothing of model B). A work is in
**steady state** once a warm-up of it ended (``warmup()``, the serving manager's warm-up, the
training warm-up), or after ``settle`` consecutive calls that compiled nothing. From then on, a call
that compiles a new program is reported: ``warn`` logs a warning, ``error`` raises
``RecompileError``, ``ignore`` does nothing. Calls inside a warm-up are never reported.

Each message says what compiled, the call's shape, and the setting that would have covered it
(:func:`generate_advice`, :func:`serve_advice`, :func:`train_advice`, :func:`infer_advice`).

Settings: ``TRANSFORMERS_TPU_EXT_COMPILE_ON_RECOMPILE`` (``warn``, the default; ``error``; ``ignore``) and
``TRANSFORMERS_TPU_EXT_COMPILE_RECOMPILE_SETTLE`` (20 calls), or :func:`configure`. No torch here.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..config import Overrides, check_variables
from ..settings.parser import parse
from .settings import SETTINGS

__all__ = [
    "ACTIONS",
    "ENV",
    "GuardSettings",
    "WORKS",
    "WorkState",
    "check_environment",
    "configure",
    "current",
    "generate_advice",
    "infer_advice",
    "message",
    "observe",
    "reset",
    "serve_advice",
    "train_advice",
]

ACTIONS = ("warn", "error", "ignore")
WORKS = ("generate", "serve", "train", "infer")
#: Field -> variable (declared in ``compilation.settings``).
ENV: dict[str, str] = {s.field: s.name for s in SETTINGS if s.field}
#: How many recompiles of one work are logged in warn mode before the guard only counts them.
WARN_LIMIT = 5


@dataclass(frozen=True)
class GuardSettings:
    """``on_recompile``: ``warn`` | ``error`` | ``ignore``; ``settle``: consecutive calls without a new
    program after which a work that was not warmed up is in steady state (``0``: at once)."""

    on_recompile: str = "warn"
    settle: int = 20

    def __post_init__(self) -> None:
        if self.on_recompile not in ACTIONS:
            raise ValueError(f"GuardSettings.on_recompile must be one of {', '.join(ACTIONS)}, got {self.on_recompile!r}")
        if not isinstance(self.settle, int) or isinstance(self.settle, bool) or self.settle < 0:
            raise ValueError(f"GuardSettings.settle must be an integer >= 0, got {self.settle!r}")


def _parse(name: str, raw: str) -> Any:
    setting = next(s for s in SETTINGS if s.field == name)
    if setting.kind == "integer":
        try:
            return parse(setting, raw)
        except ValueError:
            raise ValueError(f"{ENV[name]}={raw.strip()!r}: expected an integer >= 0") from None
    return parse(setting, raw)


_overrides = Overrides(GuardSettings, "recompile guard")


def current(environ: Mapping[str, str] | None = None) -> GuardSettings:
    """The settings in force: :func:`configure` > environment > defaults. Raises naming the variable."""
    environ = os.environ if environ is None else environ
    problems = check_environment(environ)
    if problems:
        raise ValueError("; ".join(problems))
    values = {name: _parse(name, environ[var]) for name, var in ENV.items() if environ.get(var, "").strip()}
    values.update(_overrides.values())
    return GuardSettings(**values)


def configure(**changes: Any) -> GuardSettings:
    """``configure(on_recompile="error", settle=0)``: for this process, over the environment."""
    _overrides.update(changes)
    return current()


def reset() -> None:
    """Forget :func:`configure` (environment and defaults apply again)."""
    _overrides.clear()


def check_environment(environ: Mapping[str, str]) -> list[str]:
    """One message per invalid guard variable (checked at activation, listed by doctor)."""
    return check_variables(environ, ENV, _parse, GuardSettings)


# ---------------------------------------------------------------------------------------------
# Steady state


@dataclass
class WorkState:
    """What the guard knows of one work in this process (mutated under the caller's lock)."""

    warming: int = 0  # warm-ups of this work in progress
    steady: str | None = None  # "warmup" or "settle" once in steady state
    quiet: int = 0  # consecutive calls that compiled nothing (before steady state)
    covered: dict[str, Any] = field(default_factory=dict)  # what the last warm-up covered (for advice)
    reported: int = 0  # recompiles reported
    seen: set[Any] = field(default_factory=set)  # call shapes seen (the plugin's own count)


def observe(state: WorkState, new_programs: int, settle: int) -> bool:
    """Account for one finished call; ``True`` when it compiled in steady state (to report)."""
    if state.warming:
        return False
    if state.steady is None:
        state.quiet = 0 if new_programs else state.quiet + 1
        if state.quiet >= settle:
            state.steady = "settle"
        return False
    if new_programs:
        state.reported += 1
        return True
    return False


def warmed_up(state: WorkState, covered: Mapping[str, Any] | None) -> None:
    """A warm-up of the work ended: steady state from now on."""
    state.steady = "warmup"
    state.quiet = 0
    if covered:
        state.covered = dict(covered)


# ---------------------------------------------------------------------------------------------
# Messages


def programs_text(new_programs: int, graphs: int | None) -> str:
    what = f"{new_programs} new program{'s' if new_programs != 1 else ''}"
    if graphs is None or graphs > new_programs:
        return what
    eager = new_programs - graphs
    parts = [f"{graphs} torch.compile graph{'s' if graphs != 1 else ''}"] if graphs else []
    parts += [f"{eager} eager operation{'s' if eager != 1 else ''}"] if eager else []
    return f"{what} ({', '.join(parts)})" if parts else what


def message(work: str, what: str, call: str, advice: str, steady: str | None, action: str) -> str:
    """The whole report: ``<work> compiled <what> in steady state (...): <call>. <advice>``."""
    since = "after its warm-up" if steady == "warmup" else "in steady state (after calls that compiled nothing)"
    verb = {"generate": "generate()", "serve": "a continuous-batching step", "train": "a training step",
            "infer": "a padded inference forward"}[work]
    follow = (
        f"{ENV['on_recompile']}=ignore silences this"
        if action == "warn"
        else f"{ENV['on_recompile']}=warn only logs it"
    )
    return f"transformers-tpu-ext: {verb} compiled {what} {since}: {call}. {advice} ({follow}.)"


def _limits(covered: Mapping[str, Any]) -> str:
    parts = []
    if covered.get("max_prompt_length"):
        parts.append(f"prompts up to {covered['max_prompt_length']} tokens")
    if covered.get("max_new_tokens"):
        parts.append(f"max_new_tokens up to {covered['max_new_tokens']}")
    if covered.get("batch_sizes"):
        parts.append(f"batch sizes {', '.join(map(str, covered['batch_sizes']))}")
    elif covered.get("max_batch_size"):
        parts.append(f"batches up to {covered['max_batch_size']}")
    return ", ".join(parts)


def generate_advice(
    batch: int,
    prompt_length: int,
    max_new_tokens: int | None,
    covered: Mapping[str, Any],
    sampling: bool = False,
    cache: int | None = None,
) -> str:
    """Which warm-up covers a ``generate()`` call of this shape (``cache``: the static-cache length it ran with)."""
    new = max_new_tokens or 1
    prompt = prompt_length
    if covered:
        top_prompt = int(covered.get("max_prompt_length") or 0)
        top_new = int(covered.get("max_new_tokens") or 0)
        sizes = covered.get("batch_sizes")
        top_batch = max(sizes) if sizes else int(covered.get("max_batch_size") or 1)
        inside = prompt_length <= top_prompt and new <= top_new and batch <= top_batch
        if sizes and sampling and batch not in sizes:
            inside = False
        warmed_cache = covered.get("cache")
        if inside and warmed_cache and cache and cache > warmed_cache:
            return (
                f"The call is within the warm-up's limits ({_limits(covered)}), but the static cache has {cache} "
                f"positions, past the warm-up's {warmed_cache}: an earlier, longer call made Transformers keep a longer "
                "cache, and every bucket compiles again with it; warm up with the longest prompt and max_new_tokens "
                "the service sees (or set TRANSFORMERS_TPU_EXT_GENERATE_MAX_CACHE_LEN to that length)"
            )
        if inside:
            return (
                f"The call is within what the warm-up covered ({_limits(covered)}), so something else made a new "
                "program: other generate() options than the warm-up's (sampling, beams, a logits processor, a "
                "stopping criterion) or a changed Python number; pass the service's options to warmup(model, ...) "
                "so it compiles the same programs"
            )
        prompt, new, batch = max(prompt_length, top_prompt), max(new, top_new), max(batch, top_batch)
        where = f"Outside the warm-up ({_limits(covered)}): "
    else:
        where = "Nothing warmed generate() up: "
    sizes_arg, sizes_flag = (
        (f", batch_sizes=[{batch}]", f"--batch-sizes {batch}") if sampling else (f", max_batch_size={batch}", f"--max-batch-size {batch}")
    )
    return (
        f"{where}warmup(model, max_prompt_length={prompt}, max_new_tokens={new}{sizes_arg}) at start-up, or "
        f"`transformers-tpu warmup MODEL --max-prompt-length {prompt} --max-new-tokens {new} {sizes_flag}` ahead of "
        "time, compiles it; TRANSFORMERS_TPU_EXT_GENERATE_PROMPT_BUCKETS, TRANSFORMERS_TPU_EXT_GENERATE_BATCH_BUCKETS and "
        "TRANSFORMERS_TPU_EXT_GENERATE_CACHE_BUCKETS choose the buckets"
    )


def serve_advice(tokens: int, requests: int, shape: Sequence[int] | None, planned: Sequence[Sequence[int]]) -> str:
    """Which setting covers a continuous-batching step of ``tokens`` tokens and ``requests`` requests."""
    if shape is not None and tuple(shape) in {tuple(s) for s in planned}:
        return (
            f"The step's shape (tokens={shape[0]}, requests={shape[1]}) was warmed up, so something else made a new "
            "program: a request with other generation options than the manager's (its GenerationConfig), or a "
            "changed Python number"
        )
    return (
        f"The step's shape ({tokens} tokens, {requests} requests) is not one of the {len(planned)} warmed-up shapes: "
        "TRANSFORMERS_TPU_EXT_SERVE_MAX_BATCH_TOKENS, TRANSFORMERS_TPU_EXT_SERVE_MAX_REQUESTS, "
        "TRANSFORMERS_TPU_EXT_SERVE_TOKEN_BUCKETS and TRANSFORMERS_TPU_EXT_SERVE_REQUEST_BUCKETS set them"
    )


def train_advice(rows: int, length: int | None, warmed: Sequence[int], ladder_top: int | None = None) -> str:
    """Which setting covers a training batch of ``rows`` x ``length`` tokens."""
    if length is None:
        return "The batch has no sequence axis the plugin pads: TRANSFORMERS_TPU_EXT_TRAIN_BUCKETS pads token batches"
    if warmed and length in set(warmed):
        return (
            f"Batches of {length} tokens were warmed up, so something else made a new program: another batch size "
            f"({rows} rows), other keys in the batch, gradient accumulation or clipping changing, or a Python number "
            "changing (a learning rate passed as a float)"
        )
    top = max(length, max(warmed) if warmed else 0)
    return (
        f"training.warmup(trainer, max_length={top}) (or warmup(trainer, work=\"train\", max_length={top})) before "
        f"train() compiles the {length}-token bucket; TRANSFORMERS_TPU_EXT_TRAIN_BUCKETS sets the buckets"
    )


def infer_advice(rows: int, length: int, covered: Mapping[str, Any]) -> str:
    """Which warm-up covers a padded inference forward of ``rows`` x ``length`` (the padded shape)."""
    top_rows = int(covered.get("max_batch_size") or 0)
    top_length = int(covered.get("max_length") or 0)
    if covered and rows <= top_rows and length <= top_length:
        return (
            f"The call ({rows} x {length}, padded) is within the warm-up (batches up to {top_rows}, {top_length} tokens), "
            "so something else made a new program: other options than the warm-up's (output_hidden_states), another "
            "model, or operations on the outputs on the TPU at their cut-back shapes (move them to the host first)"
        )
    rows, length = max(rows, top_rows), max(length, top_length)
    return (
        f"warmup(model_or_pipeline, work=\"infer\", max_batch_size={rows}, max_length={length}) at start-up, or "
        f"`transformers-tpu warmup MODEL --infer {length} --max-batch-size {rows}` ahead of time, compiles every bucket"
    )
