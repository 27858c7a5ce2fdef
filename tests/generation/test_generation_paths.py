"""Issue 18: ``generate()`` and serving on the paths next to the tested ones, each against plain CPU.

Every test runs the same user code twice: on plain CPU with the plugin deactivated (the
reference), then on the simulated TPU with the plugin active, and compares what a user sees
(tokens, the cache handed back, graphs compiled after a warm-up). Where it is cheap, a third run
of the same code on the simulated TPU with the plugin deactivated shows that upstream gives the
CPU's answer there, so a difference is the plugin's.

The models are the context-sensitive tiny models of ``transformers_tpu_ext.testing.tiny``
(``check_context_sensitive``): a token that attends to the wrong positions changes what comes
next. The batches are ragged and left-padded (rows with 0, 3 and 6 padding columns), as a
tokenizer pads them.

Only public names are used (``transformers``, the ``transformers_tpu_ext`` top level,
``transformers_tpu_ext.testing`` and ``testing.tiny``, the ``simulated_tpu`` fixture of the
package's pytest plugin): the tests do not depend on where the plugin keeps its code.

Items of the issue: 1 (a KV cache that is not the plugin's static one, in every way a user gets
one), 2 (``use_cache=False``), 3 (a ``ContinuousBatchingManager`` alive), 4 (``token_healing``),
5 (``warmup(..., do_sample=True, batch_sizes=...)``), 6 (the static cache handed back), and 7
(the prefill's 4D masks cross the host link).
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import transformers_tpu_ext as ext  # noqa: E402
from transformers_tpu_ext.testing import tiny  # noqa: E402

NEW_TOKENS = 6
PADDING = (0, 3, 6)  # left-padding columns per row of the ragged batch


@pytest.fixture
def tpu(simulated_tpu):
    """The simulated TPU with the plugin active and its generation and serving patches applied."""
    import transformers.generation.continuous_batching.continuous_api  # noqa: F401 - patch targets imported
    import transformers.generation.utils  # noqa: F401

    ext.activate()
    assert {"generation", "continuous_batching"} <= set(ext.active_patches())
    return simulated_tpu


@contextlib.contextmanager
def plugin_disabled():
    """Plain Transformers inside the block (every patch reverted), the plugin again after it."""
    ext.deactivate()
    try:
        yield
    finally:
        ext.activate()


def context_sensitive_model(arch: str = "qwen3", **overrides: Any) -> Any:
    model = tiny.tiny_model(arch, seed=0, **overrides)
    tiny.check_context_sensitive(model)
    return model


def ragged_batch(vocab: int, rows: int = 3, length: int = 10, seed: int = 0) -> tuple[Any, Any]:
    """``rows`` prompts of ``length`` columns, left-padded as a tokenizer pads them (pad id 0)."""
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(2, vocab, (rows, length), generator=gen)
    mask = torch.ones_like(ids)
    for row in range(rows):
        mask[row, : PADDING[row % len(PADDING)]] = 0
    ids[mask == 0] = 0
    return ids, mask


def cpu_tpu_and_upstream_tpu(run: Callable[[Any, str], Any], model: Any) -> tuple[Any, Any, Any]:
    """``run(model, device)``: plain CPU (plugin off), the TPU (plugin on), the TPU again (plugin off)."""
    with plugin_disabled():
        expected = run(model, "cpu")
    model.to("tpu")
    got = run(model, "tpu")
    with plugin_disabled():
        upstream_on_tpu = run(model, "tpu")
    return expected, got, upstream_on_tpu


def tokens(out: Any) -> Any:
    return (out if isinstance(out, torch.Tensor) else out.sequences).cpu()


def first_difference(a: Any, b: Any) -> str:
    """Where two [rows, length] token tensors part (for the assertion message)."""
    if a.shape != b.shape:
        return f"shapes differ: {list(a.shape)} vs {list(b.shape)}"
    rows, cols = torch.nonzero(a != b, as_tuple=True)
    return f"row {int(rows[0])}, column {int(cols[0])}: {a[rows[0]].tolist()} vs {b[rows[0]].tolist()}"


def assert_same_tokens(got: Any, expected: Any) -> None:
    assert got.shape == expected.shape and torch.equal(got, expected), (
        "tokens differ from plain Transformers on CPU: " + first_difference(got, expected)
    )


# -------------------------------------------------------------------------------------------------
# 1. A KV cache that is not the plugin's static one, with a padded batch


def _dynamic(model: Any) -> dict:
    return dict(cache_implementation="dynamic")


def _no_compile(model: Any) -> dict:
    return dict(disable_compile=True)


def _static_cache_setting_off(model: Any) -> dict:
    return {}  # with TRANSFORMERS_TPU_EXT_GENERATE_STATIC_CACHE=0 (set by the test)


def _dynamic_cache_object(model: Any) -> dict:
    from transformers import DynamicCache

    return dict(past_key_values=DynamicCache(config=model.config))


def _dynamic_seeded_sampling(model: Any) -> dict:
    torch.manual_seed(7)
    return dict(cache_implementation="dynamic", do_sample=True, top_k=20, temperature=0.8)


DYNAMIC_CACHE_CALLS = {
    "cache_implementation=dynamic": _dynamic,
    "disable_compile=True": _no_compile,
    "TRANSFORMERS_TPU_EXT_GENERATE_STATIC_CACHE=0": _static_cache_setting_off,
    "DynamicCache as past_key_values": _dynamic_cache_object,
    "dynamic cache, seeded sampling": _dynamic_seeded_sampling,
}


@pytest.mark.slow
@pytest.mark.parametrize("how", list(DYNAMIC_CACHE_CALLS))
def test_a_padded_batch_with_a_dynamic_cache_gets_the_cpus_tokens(tpu, monkeypatch, how):
    # Issue 18, item 1: the device loop's 2D mask stops at the prompt, so the model pads it with
    # zeros and masks every generated token out of the later steps.
    if how == "TRANSFORMERS_TPU_EXT_GENERATE_STATIC_CACHE=0":
        monkeypatch.setenv("TRANSFORMERS_TPU_EXT_GENERATE_STATIC_CACHE", "0")
    model = context_sensitive_model()
    ids, mask = ragged_batch(model.config.vocab_size)
    options = DYNAMIC_CACHE_CALLS[how]

    def run(model: Any, device: str) -> Any:
        kwargs = {"do_sample": False, **options(model)}
        out = model.generate(ids.to(device), attention_mask=mask.to(device), max_new_tokens=NEW_TOKENS, **kwargs)
        return tokens(out)

    expected, got, upstream_on_tpu = cpu_tpu_and_upstream_tpu(run, model)
    assert torch.equal(upstream_on_tpu, expected), "precondition: upstream on the simulated TPU gives the CPU's tokens"
    assert_same_tokens(got, expected)


@pytest.mark.slow  # the first call takes the plugin's compiled static-cache path
def test_continuing_from_the_returned_cache_gets_the_cpus_tokens(tpu):
    # Issue 18, item 1: the cache a return_dict_in_generate=True call returns is a DynamicCache
    # (as upstream's); the next turn passes it back with the whole conversation and its mask.
    model = context_sensitive_model()
    ids, mask = ragged_batch(model.config.vocab_size)
    turn = torch.randint(2, model.config.vocab_size, (3, 4), generator=torch.Generator().manual_seed(1))

    def run(model: Any, device: str) -> Any:
        first = model.generate(
            ids.to(device), attention_mask=mask.to(device), max_new_tokens=3, do_sample=False, return_dict_in_generate=True
        )
        history = torch.cat([first.sequences, turn.to(device)], dim=1)
        history_mask = torch.cat([mask.to(device), torch.ones_like(history[:, ids.shape[1] :])], dim=1)
        out = model.generate(
            history, attention_mask=history_mask, past_key_values=first.cache, max_new_tokens=NEW_TOKENS, do_sample=False
        )
        return torch.cat([tokens(first), tokens(out)], dim=1)

    expected, got, upstream_on_tpu = cpu_tpu_and_upstream_tpu(run, model)
    assert torch.equal(upstream_on_tpu, expected), "precondition: upstream on the simulated TPU gives the CPU's tokens"
    assert_same_tokens(got, expected)


def test_a_batched_pipeline_with_a_dynamic_cache_gets_the_cpus_text(tpu):
    # Issue 18, item 1: pipeline() pads the batch on the left; every prompt must come back right.
    from transformers import pipeline

    tokenizer = tiny.tiny_tokenizer()
    model = context_sensitive_model(vocab_size=len(tokenizer))
    prompts = [text[: 8 + 6 * i] for i, text in enumerate(tiny.TINY_TEXT)]  # 5 lengths: a padded batch of 5
    options = dict(max_new_tokens=NEW_TOKENS, do_sample=False, cache_implementation="dynamic", return_full_text=False)

    with plugin_disabled():
        expected = pipeline("text-generation", model=model, tokenizer=tokenizer, device="cpu", batch_size=5)(prompts, **options)
    model.to("tpu")
    runner = pipeline("text-generation", model=model, tokenizer=tokenizer, batch_size=5)
    assert runner.device.type == "tpu"
    got = runner(prompts, **options)
    expected_texts = [out[0]["generated_text"] for out in expected]
    got_texts = [out[0]["generated_text"] for out in got]
    right = sum(a == b for a, b in zip(got_texts, expected_texts))
    assert got_texts == expected_texts, f"{right} of {len(prompts)} prompts continued as on CPU"


# -------------------------------------------------------------------------------------------------
# 2. use_cache=False


@pytest.mark.parametrize("rows", [1, 3])
def test_use_cache_false_gets_the_cpus_tokens(tpu, rows):
    # Issue 18, item 2: without a cache every step must see the whole sequence; the device loop
    # feeds only the newest token (batch 1: wrong after the first token; batch 3: raises).
    model = context_sensitive_model()
    ids, mask = ragged_batch(model.config.vocab_size, rows=rows)

    def run(model: Any, device: str) -> Any:
        out = model.generate(
            ids.to(device), attention_mask=mask.to(device), max_new_tokens=NEW_TOKENS, do_sample=False, use_cache=False
        )
        return tokens(out)

    expected, got, upstream_on_tpu = cpu_tpu_and_upstream_tpu(run, model)
    assert torch.equal(upstream_on_tpu, expected), "precondition: upstream on the simulated TPU gives the CPU's tokens"
    assert_same_tokens(got, expected)


# -------------------------------------------------------------------------------------------------
# 3. A ContinuousBatchingManager leaves the model usable


def _manager(model: Any) -> Any:
    from transformers import ContinuousBatchingConfig, GenerationConfig

    config = GenerationConfig(do_sample=False, eos_token_id=1, pad_token_id=0, max_new_tokens=4)
    # A fixed, small paged cache on both devices (upstream on CPU would size it from host RAM).
    return model.init_continuous_batching(
        generation_config=config, continuous_batching_config=ContinuousBatchingConfig(num_blocks=16)
    )


@contextlib.contextmanager
def manager_alive(model: Any):
    manager = _manager(model)
    try:
        yield manager
    finally:
        manager.destroy()


def _one_prompt(model: Any) -> Any:
    # One unpadded row: the generate() below is right today without a manager on every path.
    return torch.randint(2, model.config.vocab_size, (1, 10), generator=torch.Generator().manual_seed(0))


def test_forward_works_while_a_continuous_batching_manager_exists(tpu):
    # Issue 18, item 3: the manager switched the model's attention to its paged kernel for its
    # whole life; a plain forward then raised KeyError: 'tpu_positions'.
    model = context_sensitive_model()
    ids = _one_prompt(model)
    with plugin_disabled(), manager_alive(model), torch.no_grad():
        expected = model(ids).logits
    model.to("tpu")
    with manager_alive(model), torch.no_grad():
        got = model(ids.to("tpu")).logits.cpu()
    assert torch.allclose(got, expected, atol=1e-5)


@pytest.mark.parametrize(
    "options",
    [
        pytest.param({}, id="plain", marks=pytest.mark.slow),  # compiles the static-cache path
        pytest.param({"disable_compile": True}, id="disable_compile"),
    ],
)
def test_generate_works_while_a_continuous_batching_manager_exists(tpu, options):
    # Issue 18, item 3: generate() raised KeyError: 'tpu_positions' (uncompiled), or TorchDynamo's
    # wrapping of it (compiled, on the simulated TPU), while a manager existed.
    model = context_sensitive_model()
    ids = _one_prompt(model)

    def run(model: Any, device: str) -> Any:
        with manager_alive(model):
            return tokens(model.generate(ids.to(device), max_new_tokens=NEW_TOKENS, do_sample=False, **options))

    with plugin_disabled():
        expected = run(model, "cpu")
    model.to("tpu")
    assert_same_tokens(run(model, "tpu"), expected)


# -------------------------------------------------------------------------------------------------
# 4. token_healing


@pytest.mark.parametrize(
    "options",
    [
        pytest.param({}, id="plain", marks=pytest.mark.slow),  # compiles the bucketed prefill
        pytest.param({"cache_implementation": "static", "disable_compile": True}, id="static-uncompiled"),
    ],
)
def test_token_healing_returns_the_cpus_sequence(tpu, options):
    # Issue 18, item 4: upstream re-tokenizes the prompt (decode, strip, tokenize) after the plugin
    # padded it; the padding disappears, and the plugin then strips its column count from the result.
    tokenizer = tiny.tiny_tokenizer()
    tokenizer.bos_token = tokenizer.eos_token  # heal_tokens needs one; the tiny models use id 1 for both
    model = context_sensitive_model(vocab_size=len(tokenizer))
    ids = tokenizer(["The secret to baking a good cake i"], return_tensors="pt").input_ids  # ends mid-word

    def run(model: Any, device: str) -> Any:
        out = model.generate(
            ids.to(device), tokenizer=tokenizer, token_healing=True, max_new_tokens=5, do_sample=False, **options
        )
        return tokens(out)

    with plugin_disabled():
        expected = run(model, "cpu")
    model.to("tpu")
    assert_same_tokens(run(model, "tpu"), expected)


# -------------------------------------------------------------------------------------------------
# 5. warmup() for a sampling service


@pytest.mark.slow  # a warm-up compiles a bucket
def test_warmup_for_sampling_compiles_every_batch_size_it_is_given(tpu):
    # Issue 18, item 5: warm-up rounded batch 3 up to its bucket (4), but the sampling choice is
    # compiled per real row count: the first real batch of 3 compiled while serving.
    model = context_sensitive_model()
    ids = torch.randint(2, model.config.vocab_size, (3, 9), generator=torch.Generator().manual_seed(0))
    sampling = dict(do_sample=True, top_k=20, temperature=0.8)
    with plugin_disabled():
        torch.manual_seed(4)
        expected = model.generate(ids, max_new_tokens=3, **sampling)
    model.to("tpu")
    ext.warmup(model, max_prompt_length=ids.shape[1], max_new_tokens=3, batch_sizes=[3], **sampling)
    before = tpu.counters()
    torch.manual_seed(4)
    got = model.generate(ids.to("tpu"), max_new_tokens=3, **sampling)
    compiled = (tpu.counters() - before).graphs_compiled
    assert_same_tokens(got.cpu(), expected)
    assert compiled == 0, f"a batch of 3 compiled {compiled} graph(s) after warmup(batch_sizes=[3])"


# -------------------------------------------------------------------------------------------------
# 6. The static cache handed back


@pytest.mark.parametrize(
    "first",
    [
        pytest.param({}, id="after-a-plain-generate", marks=pytest.mark.slow),  # compiles
        pytest.param({"cache_implementation": "static", "disable_compile": True}, id="after-a-static-call"),
    ],
)
def test_the_static_cache_returned_has_upstreams_length(tpu, first):
    # Issue 18, item 6: the plugin's own earlier (bucketed, 64-slot) cache was counted as the
    # length upstream would keep across calls.
    model = context_sensitive_model()
    ids = torch.randint(2, model.config.vocab_size, (2, 9), generator=torch.Generator().manual_seed(0))
    second = {"cache_implementation": "static", "return_dict_in_generate": True}
    if first.get("disable_compile"):
        second["disable_compile"] = True

    def run(model: Any, device: str) -> dict:
        model.generate(ids.to(device), max_new_tokens=3, do_sample=False, **first)
        out = model.generate(ids.to(device), max_new_tokens=4, do_sample=False, **second)
        cache = out.cache
        return dict(
            type=type(cache).__name__,
            max_length=int(cache.get_max_length()),
            slots=int(cache.layers[0].keys.shape[-2]),
            rows=int(cache.layers[0].keys.shape[0]),
            seen=int(cache.get_seq_length()),
            sequences=tokens(out).tolist(),
        )

    with plugin_disabled():
        expected = run(context_sensitive_model(), "cpu")  # a fresh model: it remembers its static caches
    model.to("tpu")
    assert run(model, "tpu") == expected


# -------------------------------------------------------------------------------------------------
# 7. The prefill's 4D masks are built on the device


@pytest.mark.slow  # compiles the bucketed prefill
def test_the_prefill_sends_no_4d_mask_to_the_tpu(tpu):
    # Issue 18, item 7: the prefill built its [rows, 1, chunk, cache] mask on the host and sent it
    # once per chunk; the decode loop already sends only the 2D mask (rows x cache) once per call.
    model = context_sensitive_model()
    ids, mask = ragged_batch(model.config.vocab_size, rows=4, length=12)  # one 16-token chunk, batch bucket 4
    with plugin_disabled():
        expected = model.generate(ids, attention_mask=mask, max_new_tokens=1, do_sample=False)
    model.to("tpu")
    model.generate(ids.to("tpu"), attention_mask=mask.to("tpu"), max_new_tokens=1, do_sample=False)  # compiles
    before = tpu.counters()
    got = model.generate(ids.to("tpu"), attention_mask=mask.to("tpu"), max_new_tokens=1, do_sample=False)
    sent = (tpu.counters() - before).h2d_bytes
    assert_same_tokens(got.cpu(), expected)
    rows, chunk, cache = 4, 16, 64  # the call's buckets (docs/generation.md, "The bucket policy")
    assert sent < rows * chunk * cache, f"{sent} bytes sent to the TPU for one prefill chunk: a 4D mask crossed"
