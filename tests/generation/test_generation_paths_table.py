"""docs/generation.md's "Which path a call takes" is the policy's, and the wrappers decide as it says.

1. The table in the docs is ``generation.paths.path_table()``, verbatim (``python
   scripts/gen_docs_tables.py`` rewrites it): computed by the predicates the wrappers call.
2. Every row, written as a user writes it, runs through a real ``generate()`` on the simulated TPU
   with ``TRANSFORMERS_VERBOSITY=debug``-level logging; the decisions the wrappers log (the plan, the
   decoding loop, where the masks are built) give the row's cells. So the facts the glue reads off
   real calls, models and settings are the facts the table assumed.
"""

from __future__ import annotations

import contextlib
import logging
import re
from pathlib import Path
from typing import Any, Callable

import pytest

from transformers_tpu_ext.generation import paths, policy

ROOT = Path(__file__).resolve().parents[2]


def test_the_docs_table_is_the_policys():
    text = (ROOT / "docs" / "generation.md").read_text()
    assert paths.BEGIN in text and paths.END in text, "docs/generation.md lost the generated table's markers"
    generated = text[text.index(paths.BEGIN) + len(paths.BEGIN) : text.index(paths.END)].strip()
    assert generated == paths.path_table(), "run: python scripts/gen_docs_tables.py"


def test_every_example_has_its_own_row_and_the_upstream_rows_say_why():
    rows = [example.writes for example in paths.EXAMPLES]
    assert len(rows) == len(set(rows))
    for example in paths.EXAMPLES:
        path = paths.path_of(example)
        assert path.why, example.writes
        if path.cache == paths.UPSTREAM:
            assert path.loop == path.buckets == path.masks == "—"


# -------------------------------------------------------------------------------------------------
# The wrappers decide as the table says


class _Decisions(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@contextlib.contextmanager
def _logged_decisions():
    logger = logging.getLogger("transformers_tpu_ext")
    handler, level = _Decisions(), logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    try:
        yield handler.messages
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


_PREFIX = "transformers-tpu-ext: "


def _path_from_logs(messages: list[str], mode: str) -> paths.Path | None:
    """The row's cells, from the first decisions the wrappers logged for the call."""
    plan = loop = masks = None
    for message in messages:
        if not message.startswith(_PREFIX):
            continue
        message = message[len(_PREFIX) :]
        if plan is None and (m := re.fullmatch(r"generate\(\) left to upstream: (.*)", message, re.S)):
            plan = policy.CallPlan(True, m[1])
        elif plan is None and (
            m := re.fullmatch(
                r"generate\(\) handled: (the plugin's default|the caller's) static cache; "
                r"(bucketed|bucketed without dummy rows|not bucketed \((.*)\))",
                message,
                re.S,
            )
        ):
            bucket = m[3] is None
            plan = policy.CallPlan(
                False, "bucketed" if bucket else m[3], static_cache=m[1] == "the plugin's default", bucket=bucket,
                pad_batch=m[2] == "bucketed",
            )
        elif loop is None and (m := re.fullmatch(r"decoding loop on the (device|host) \((.*)\)", message, re.S)):
            loop = policy.DecodePath(m[1] == "device", m[2])
        elif masks is None and (m := re.fullmatch(r"4D masks built on the (device|host) \((.*)\)", message, re.S)):
            masks = policy.DecodePath(m[1] == "device", m[2])
    return None if plan is None else paths.cells(plan, loop, masks, mode)


NEW = 4


def _ragged(vocab: int, rows: int = 3, length: int = 10) -> tuple[Any, Any]:
    import torch

    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(2, vocab, (rows, length), generator=gen)
    mask = torch.ones_like(ids)
    for row in range(rows):
        mask[row, : (0, 3, 6)[row % 3]] = 0
    ids[mask == 0] = 0
    return ids, mask


def _tiny(config_class: str, **fields: Any) -> Any:
    """A tiny model of another family, built from its config (random weights, no download)."""
    import torch
    import transformers

    torch.manual_seed(0)
    config = getattr(transformers, config_class)(vocab_size=320, **fields)
    return transformers.AutoModelForCausalLM.from_config(config) if not config.is_encoder_decoder else (
        transformers.AutoModelForSeq2SeqLM.from_config(config)
    )


def _qwen3_with_own_masks(base: Any) -> Any:
    """A Qwen3 whose class builds its own generation masks (as multimodal models do), same weights."""
    from transformers import Qwen3ForCausalLM
    from transformers.masking_utils import create_masks_for_generate

    class OwnMasks(Qwen3ForCausalLM):
        @staticmethod
        def create_masks_for_generate(*args: Any, **kwargs: Any) -> Any:
            return create_masks_for_generate(*args, **kwargs)

    model = OwnMasks(base.config)
    model.load_state_dict(base.state_dict())
    return model


class MyProcessor:  # a logits processor of the caller's (the table names it)
    def __call__(self, input_ids: Any, scores: Any) -> Any:
        return scores


def _recipe(model: Any, input_ids: Any, logits_processor: Any, stopping_criteria: Any, generation_config: Any, **kwargs: Any) -> Any:
    """A ``custom_generate`` decoding method (a local one: Hub recipes need a download)."""
    return type(model)._sample(model, input_ids, logits_processor, stopping_criteria, generation_config, **kwargs)


def _runs(qwen3: Any) -> dict[str, Callable[[Any], tuple[Any, dict]]]:
    """How each row of the table is written: ``monkeypatch -> (model, generate kwargs[, context])``;
    inputs on the TPU, ``generate()`` called inside ``context`` if given."""
    import torch
    from transformers import DynamicCache, LogitsProcessorList

    from transformers_tpu_ext.testing import tiny

    ids, mask = _ragged(qwen3.config.vocab_size)
    plain = {"input_ids": ids, "attention_mask": mask, "max_new_tokens": NEW, "do_sample": False}

    def options(example: paths.Example) -> Callable:
        return lambda monkeypatch: (qwen3, {**plain, **example.options})

    def setting(name: str, value: str) -> Callable:
        def run(monkeypatch: Any) -> tuple[Any, dict]:
            monkeypatch.setenv(name, value)
            return qwen3, plain

        return run

    def healing(monkeypatch: Any) -> tuple[Any, dict]:
        tokenizer = tiny.tiny_tokenizer()
        tokenizer.bos_token = tokenizer.eos_token  # heal_tokens needs one; the tiny models use id 1 for both
        prompt = tokenizer(["The secret to baking a good cake i"], return_tensors="pt").input_ids
        return qwen3, {"input_ids": prompt, "max_new_tokens": NEW, "do_sample": False, "token_healing": True, "tokenizer": tokenizer}

    def eager_stance(monkeypatch: Any) -> tuple[Any, dict, Any]:
        return qwen3, plain, torch.compiler.set_stance("force_eager")

    def other_model(build: Callable[[], Any], **extra: Any) -> Callable:
        def run(monkeypatch: Any) -> tuple[Any, dict]:
            model = build().to("tpu")
            model.generation_config.pad_token_id = 0
            return model, {**plain, **extra}

        return run

    def non_causal() -> Any:
        model = tiny.tiny_model("qwen3", seed=0)
        model.config.is_causal = False
        return model

    runs: dict[str, Callable] = {example.writes: options(example) for example in paths.EXAMPLES if example.options}
    embeds = qwen3.get_input_embeddings()(ids.to("tpu")).detach().cpu()
    runs.update(
        {
            "`generate(ids, attention_mask=mask)`: greedy, no cache argument": lambda mp: (qwen3, plain),
            "`logits_processor=LogitsProcessorList([MyProcessor()])`": lambda mp: (
                qwen3, {**plain, "logits_processor": LogitsProcessorList([MyProcessor()])}),
            "`prefix_allowed_tokens_fn=allowed`": lambda mp: (
                qwen3, {**plain, "prefix_allowed_tokens_fn": lambda batch, sent: list(range(2, 40))}),
            "`inputs_embeds=embeds`": lambda mp: (
                qwen3, {"inputs_embeds": embeds, "attention_mask": mask, "max_new_tokens": NEW, "do_sample": False}),
            "`position_ids=positions` (or another per-row tensor)": lambda mp: (
                qwen3, {**plain, "position_ids": (mask.cumsum(-1) - 1).clamp(min=0)}),
            "`TRANSFORMERS_TPU_EXT_GENERATE_BUCKETS=0`": setting("TRANSFORMERS_TPU_EXT_GENERATE_BUCKETS", "0"),
            "`TRANSFORMERS_TPU_EXT_GENERATE_DEVICE_DECODE=0`": setting("TRANSFORMERS_TPU_EXT_GENERATE_DEVICE_DECODE", "0"),
            "`TRANSFORMERS_TPU_EXT_GENERATE_STATIC_CACHE=0`": setting("TRANSFORMERS_TPU_EXT_GENERATE_STATIC_CACHE", "0"),
            "`past_key_values=cache` (any cache object: one you made, one a previous call returned)": lambda mp: (
                qwen3, {**plain, "past_key_values": DynamicCache(config=qwen3.config)}),
            "`token_healing=True`": healing,
            'inside `torch.compiler.set_stance("force_eager")`': eager_stance,
            "`assistant_model=assistant`, `prompt_lookup_num_tokens=3`": lambda mp: (
                qwen3, {**plain, "input_ids": ids[:1], "attention_mask": None, "prompt_lookup_num_tokens": 3}),
            "`custom_generate=...` (contrastive search, DoLa and the other Hub recipes)": lambda mp: (
                qwen3, {**plain, "custom_generate": _recipe}),
            "a non-text main input (`generate(features)`, floating point)": lambda mp: (
                qwen3, {"inputs": torch.randn(3, 10, qwen3.config.hidden_size), "max_new_tokens": NEW}),
            "an encoder-decoder model other than Whisper (T5, BART...; Whisper: the family table below)": other_model(
                lambda: _tiny("T5Config", d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4, decoder_start_token_id=0)),
            "a model with chunked-attention or shared key/value layers (Llama 4, Gemma 3n...)": other_model(
                lambda: _tiny("Llama4TextConfig", hidden_size=32, intermediate_size=64, intermediate_size_mlp=64,
                              num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                              num_local_experts=2, attention_chunk_size=16)),
            "a state-space or hybrid model (Mamba, Mamba2, Jamba, Falcon-H1, LFM2, Qwen3-Next: see below)": other_model(
                lambda: tiny.tiny_model("mamba", seed=0)),
            "a state-space or hybrid model of another family (Falcon-Mamba, Zamba, Bamba...)": other_model(
                lambda: _tiny("FalconMambaConfig", hidden_size=32, num_hidden_layers=2, state_size=8, expand=2,
                              conv_kernel=4)),
            "a model that makes its own cache (RWKV, XLNet, Reformer...)": other_model(
                lambda: _tiny("RwkvConfig", hidden_size=32, num_hidden_layers=2, attention_hidden_size=32,
                              intermediate_size=64, context_length=64)),
            "a model whose forward takes no `position_ids` (BART's decoder, MPT, BLOOM...)": other_model(
                lambda: _tiny("BartConfig", d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
                              decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, is_decoder=True,
                              is_encoder_decoder=False)),
            "a model that builds its own generation masks (multimodal: Gemma 3, PaliGemma...)": other_model(
                lambda: _qwen3_with_own_masks(tiny.tiny_model("qwen3", seed=0))),
            "a model whose attention is not causal (`config.is_causal=False`)": other_model(non_causal),
        }
    )
    return runs


#: Rows whose call upstream itself refuses after the decision was made (the decision is what is checked).
_UPSTREAM_RAISES = {"a non-text main input (`generate(features)`, floating point)"}


@pytest.mark.slow  # one real generate() per row (about 30 rows, shared graphs)
def test_each_documented_row_takes_its_path(simulated_tpu, monkeypatch):
    import torch
    import transformers.generation.utils  # noqa: F401 - the patch target

    import transformers_tpu_ext as ext
    from transformers_tpu_ext.testing import tiny

    ext.activate()
    qwen3 = tiny.tiny_model("qwen3", seed=0).to("tpu")
    runs = _runs(qwen3)
    assert set(runs) == {example.writes for example in paths.EXAMPLES}, "every row of the table runs here"
    wrong = {}
    for example in paths.EXAMPLES:
        with monkeypatch.context() as patch:
            model, kwargs, *context = runs[example.writes](patch)
            kwargs = {k: v.to("tpu") if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()}
            with _logged_decisions() as messages, (context[0] if context else contextlib.nullcontext()):
                try:
                    model.generate(**kwargs)
                except Exception as error:
                    if example.writes not in _UPSTREAM_RAISES:
                        wrong[example.writes] = (f"{type(error).__name__}: {error}"[:300], None)
                        continue
        mode = example.call.get("mode") or paths.mode_of(example.options)
        got, expected = _path_from_logs(messages, mode), paths.path_of(example)
        if got != expected:
            wrong[example.writes] = (got, expected)
    assert not wrong, "\n".join(f"{row}:\n  logged {got}\n  table  {expected}" for row, (got, expected) in wrong.items())
