"""Tiny, fully local models and tokenizers for the demo, the tests and users' own CI.

Nothing here touches the Hub: the tokenizer is a byte-level BPE trained in-process on a few
sentences, the model is built from a config with random (seeded) weights.

The models are **context-sensitive** by default: their weights are drawn with
``initializer_range=0.3`` (0.02-0.03 for Gemma, which scales its embeddings by ``sqrt(hidden)``;
Transformers' default, 0.02, gives most other tiny models a degenerate tiny model whose greedy
output repeats the last prompt token whatever came before, so that "the same tokens as on CPU"
proves nothing: attending to the wrong positions goes unnoticed). :func:`check_context_sensitive`
asserts it: two prompts that end with the same tokens but differ before them must continue
differently.

Architectures (:data:`ARCHITECTURES`), one per decoder family Transformers ships in these shapes::

    qwen3     GQA (2 KV heads for 4 query heads), tied input/output embeddings
    llama     multi-head attention (as many KV heads as query heads), untied
    falcon    multi-query attention (1 KV head), tied
    mistral   sliding-window attention (window 8) on every layer, GQA
    gemma2    sliding (window 8) and global layers alternating, logit soft-capping
    gemma3    sliding (window 8) and global layers, text-only Gemma 3
    gpt2      absolute (learned) position embeddings, no rotary
    phi3      partial rotary (half of each head), GQA
    gpt_neox  partial rotary (a quarter of each head), parallel residual

and ``glm4`` (2 KV heads for 8 query heads), a stand-in for GLM-4 in the tensor-parallel docs; the
mixture-of-experts families (:data:`MOE_ARCHITECTURES`): ``mixtral``, ``qwen3_moe``, ``gpt_oss`` (attention
sinks) and ``deepseek_v3`` (multi-head latent attention); the state-space and hybrid families
(:data:`RECURRENT_ARCHITECTURES`): ``mamba``, ``mamba2``, ``jamba`` (Mamba + attention + mixture of experts),
``falcon_h1`` (Mamba2 beside attention), ``lfm2`` (short convolutions + attention), ``qwen3_next`` (gated
delta rule + attention + mixture of experts).
:func:`save_hub_stand_in` puts one in a Hugging Face cache under a Hub name.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

__all__ = [
    "ARCHITECTURES",
    "DEFAULT_INITIALIZER_RANGE",
    "MOE_ARCHITECTURES",
    "RECURRENT_ARCHITECTURES",
    "TINY_TEXT",
    "check_context_sensitive",
    "save_hub_stand_in",
    "save_tiny_fp8_model",
    "save_tiny_model",
    "tiny_config",
    "tiny_lm_dataset",
    "tiny_model",
    "tiny_preference_pairs",
    "tiny_tokenizer",
]

TINY_TEXT = [
    "The secret to baking a good cake is",
    "Cloud TPUs run PyTorch natively through torch_tpu.",
    "Static shapes avoid recompilation on a TPU.",
    "Tensor parallelism splits a model across chips.",
    "A tiny model is enough to test a plugin end to end.",
]

#: Weight scale of the tiny models (Gemma's have their own): large enough that greedy output
#: depends on the whole prompt.
DEFAULT_INITIALIZER_RANGE = 0.3

_WINDOW = 8  # sliding window of the sliding-window architectures: shorter than most test prompts

# model_type and the config fields that give each architecture its trait (2 layers, width 32).
_COMMON = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, max_position_embeddings=512)
_ARCHS: dict[str, tuple[str, dict[str, Any]]] = {
    "qwen3": ("qwen3", dict(_COMMON, tie_word_embeddings=True, num_attention_heads=4, num_key_value_heads=2, head_dim=8)),
    "llama": ("llama", dict(_COMMON, tie_word_embeddings=False, num_attention_heads=4, num_key_value_heads=4, head_dim=8)),
    "falcon": (
        "falcon",
        dict(
            hidden_size=32, num_hidden_layers=2, num_attention_heads=4, multi_query=True,
            new_decoder_architecture=False, parallel_attn=True, tie_word_embeddings=True,
            max_position_embeddings=512,
        ),
    ),
    "mistral": (
        "mistral",
        dict(_COMMON, num_attention_heads=4, num_key_value_heads=2, head_dim=8, sliding_window=_WINDOW),
    ),
    "gemma2": (
        "gemma2",
        dict(
            _COMMON, num_attention_heads=4, num_key_value_heads=2, head_dim=8, query_pre_attn_scalar=8,
            sliding_window=_WINDOW, layer_types=["sliding_attention", "full_attention"],
            initializer_range=0.03,  # Gemma scales embeddings by sqrt(hidden): 0.3 saturates
        ),
    ),
    "gemma3": (
        "gemma3_text",
        dict(
            _COMMON, num_attention_heads=4, num_key_value_heads=2, head_dim=8, query_pre_attn_scalar=8,
            sliding_window=_WINDOW, layer_types=["sliding_attention", "full_attention"],
            initializer_range=0.02,  # Gemma scales embeddings by sqrt(hidden): 0.3 saturates
        ),
    ),
    "gpt2": ("gpt2", dict(n_embd=32, n_inner=64, n_layer=2, n_head=4, n_positions=512, tie_word_embeddings=True)),
    "phi3": (
        "phi3",
        dict(
            _COMMON, num_attention_heads=4, num_key_value_heads=2,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5},
        ),
    ),
    "gpt_neox": (
        "gpt_neox",
        dict(
            _COMMON, num_attention_heads=4,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25},
        ),
    ),
}

#: The architectures :func:`tiny_config` builds, one per decoder family (the generation tests run them all).
ARCHITECTURES: tuple[str, ...] = tuple(_ARCHS)

# Built too, but not a family of their own: stand-ins for the Hub models the docs name.
_ARCHS["glm4"] = (  # GLM-4-9B-0414's trait: 2 KV heads for many query heads (tensor parallelism rewrites it)
    "glm4",
    dict(_COMMON, num_attention_heads=8, num_key_value_heads=2, head_dim=8, tie_word_embeddings=False),
)


# Mixture-of-experts families (built like the others, not in ARCHITECTURES: the MoE tests run them): experts
# through Transformers' experts interface (``grouped_mm`` by default), routers of each kind.
_MOE = dict(_COMMON, num_attention_heads=4, num_key_value_heads=2, head_dim=8)
_ARCHS["mixtral"] = ("mixtral", dict(_MOE, num_local_experts=4, num_experts_per_tok=2))  # softmax top-2 router
_ARCHS["qwen3_moe"] = (  # 8 experts, top-2, every layer sparse
    "qwen3_moe",
    dict(_MOE, moe_intermediate_size=16, num_experts=8, num_experts_per_tok=2, decoder_sparse_step=1, mlp_only_layers=[]),
)
_ARCHS["gpt_oss"] = (  # attention sinks, sliding and full layers, transposed experts with biases and a clamped gate
    "gpt_oss",
    dict(
        _MOE, intermediate_size=16, num_local_experts=4, num_experts_per_tok=2, sliding_window=_WINDOW,
        layer_types=["sliding_attention", "full_attention"],
        rope_parameters={  # gpt-oss's YaRN, its original length scaled down with the tiny max length (512 / 32)
            "rope_type": "yarn", "rope_theta": 150000.0, "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
            "truncate": False, "original_max_position_embeddings": 16,
        },
    ),
)
_ARCHS["deepseek_v3"] = (  # multi-head latent attention, a dense first layer, grouped top-k routing, a shared expert
    "deepseek_v3",
    dict(
        _COMMON, moe_intermediate_size=16, num_attention_heads=4, num_key_value_heads=4, n_routed_experts=8,
        num_experts_per_tok=2, n_shared_experts=1, n_group=2, topk_group=1, first_k_dense_replace=1,
        kv_lora_rank=16, q_lora_rank=24, qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=8,
    ),
)
#: The mixture-of-experts architectures :func:`tiny_config` builds (context-sensitive too).
MOE_ARCHITECTURES: tuple[str, ...] = ("mixtral", "qwen3_moe", "gpt_oss", "deepseek_v3")


# State-space and hybrid families (issue 39), one per family generate() handles: every recurrent mixer
# Transformers 5.25 ships with a static state (docs/generation.md, "State-space and hybrid models").
# The mixture-of-experts ones run their experts as batched matrix products (``batched_mm``): what their tests
# check is the recurrent state; the experts' default path (``grouped_mm``, the ``experts`` kernel) is tested on
# the mixture-of-experts families (:data:`MOE_ARCHITECTURES`).
_SSM = dict(hidden_size=32, num_hidden_layers=2)
_HYBRID = dict(_SSM, intermediate_size=64, num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512)
_ARCHS.update({
    "mamba": ("mamba", dict(_SSM, state_size=8, expand=2, conv_kernel=4)),
    "mamba2": ("mamba2", dict(_SSM, state_size=8, expand=2, num_heads=8, head_dim=8, n_groups=1, conv_kernel=4,
                              chunk_size=16)),
    "jamba": ("jamba", dict(_HYBRID, attn_layer_period=2, attn_layer_offset=1, expert_layer_period=2, expert_layer_offset=1,
                            num_experts=4, num_experts_per_tok=2, mamba_d_state=8, mamba_d_conv=4, mamba_expand=2,
                            use_mamba_kernels=False, experts_implementation="batched_mm")),
    "falcon_h1": ("falcon_h1", dict(_HYBRID, head_dim=8, mamba_d_ssm=64, mamba_n_heads=8, mamba_d_head=8, mamba_d_state=8,
                                    mamba_d_conv=4, mamba_chunk_size=16)),
    "lfm2": ("lfm2", dict(_HYBRID, full_attn_idxs=[1], block_auto_adjust_ff_dim=False)),
    "qwen3_next": ("qwen3_next", dict(_HYBRID, head_dim=8, layer_types=["linear_attention", "full_attention"],
                                      linear_conv_kernel_dim=4, linear_key_head_dim=8, linear_value_head_dim=8,
                                      linear_num_key_heads=2, linear_num_value_heads=4, num_experts=4, num_experts_per_tok=2,
                                      moe_intermediate_size=16, shared_expert_intermediate_size=16,
                                      experts_implementation="batched_mm")),
})
#: The state-space and hybrid architectures :func:`tiny_config` builds (``tests/generation/test_recurrent_generate.py``).
RECURRENT_ARCHITECTURES: tuple[str, ...] = ("mamba", "mamba2", "jamba", "falcon_h1", "lfm2", "qwen3_next")


def tiny_tokenizer(vocab_size: int = 320) -> Any:
    """A byte-level BPE ``PreTrainedTokenizerFast`` trained on :data:`TINY_TEXT` (left padding)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<|pad|>", "<|eos|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(TINY_TEXT, trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<|pad|>", eos_token="<|eos|>", padding_side="left"
    )


def tiny_config(arch: str = "qwen3", vocab_size: int | None = None, **overrides: Any) -> Any:
    """A 2-layer, 32-wide config of ``arch`` (one of :data:`ARCHITECTURES`), context-sensitive.

    Token ids: 0 is padding, 1 is end of sequence (and beginning), as in :func:`tiny_tokenizer`.
    ``overrides`` win (e.g. ``initializer_range=0.02`` for the degenerate default init).
    """
    from transformers import AutoConfig

    if arch not in _ARCHS:
        raise ValueError(f"unknown tiny architecture {arch!r}; choose one of {list(_ARCHS)}")
    model_type, traits = _ARCHS[arch]
    params: dict[str, Any] = dict(
        vocab_size=vocab_size or len(tiny_tokenizer()),
        initializer_range=DEFAULT_INITIALIZER_RANGE,
        pad_token_id=0,
        eos_token_id=1,
        bos_token_id=1,
    )
    params.update(traits)
    params.update(overrides)
    return AutoConfig.for_model(model_type, **params)


def tiny_model(arch: str = "qwen3", seed: int = 0, **overrides: Any) -> Any:
    """A randomly initialised (seeded) causal LM of ``arch``, in float32, on CPU, in eval mode.

    Context-sensitive unless ``initializer_range`` is overridden (see :func:`check_context_sensitive`).
    """
    import torch
    from transformers import AutoModelForCausalLM

    config = tiny_config(arch, **overrides)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.generation_config.pad_token_id = config.pad_token_id
    model.generation_config.eos_token_id = config.eos_token_id
    return model.eval()


def check_context_sensitive(model: Any, *, prompt_length: int = 12, new_tokens: int = 6, seed: int = 0) -> None:
    """Raise ``AssertionError`` unless greedy output depends on more than the prompt's last tokens.

    Two prompts share their last half and differ before it; a model worth comparing tokens with
    continues them differently, and does not just repeat the last prompt token. Runs on the
    model's device, unpatched-equivalent (greedy, no sampling).
    """
    import torch

    vocab = model.config.get_text_config().vocab_size
    gen = torch.Generator().manual_seed(seed)
    first = torch.randint(2, vocab, (1, prompt_length), generator=gen)
    second = first.clone()
    second[0, : prompt_length // 2] = torch.randint(2, vocab, (prompt_length // 2,), generator=gen)
    device = getattr(model, "device", torch.device("cpu"))
    outs = [
        model.generate(p.to(device), max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False)[0, prompt_length:].cpu()
        for p in (first, second)
    ]
    if torch.equal(outs[0], outs[1]):
        raise AssertionError(
            f"{type(model).__name__} is not context-sensitive: prompts that differ only in their first "
            f"{prompt_length // 2} tokens continue identically ({outs[0].tolist()}); build it with a larger "
            "initializer_range (e.g. 0.3)"
        )
    if all(int(t) == int(first[0, -1]) for t in outs[0]):
        raise AssertionError(f"{type(model).__name__} only repeats the last prompt token; not a useful test model")


def save_tiny_model(path: str | os.PathLike[str], arch: str = "qwen3", seed: int = 0, **overrides: Any) -> Path:
    """Save a tiny model and its tokenizer to ``path`` so ``from_pretrained(path)`` works offline."""
    path = Path(path)
    tokenizer = tiny_tokenizer()
    model = tiny_model(arch, seed=seed, vocab_size=len(tokenizer), **overrides)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def save_hub_stand_in(
    repo_id: str, cache_dir: str | os.PathLike[str], arch: str = "qwen3", seed: int = 0, **overrides: Any
) -> Path:
    """Put a tiny model and tokenizer in a Hugging Face cache directory under a Hub name, offline.

    With ``HF_HUB_CACHE=cache_dir`` and ``HF_HUB_OFFLINE=1``, code that names ``repo_id``
    (``from_pretrained("Qwen/Qwen3-0.6B")``, ``pipeline(model=...)``, ``transformers serve Qwen/Qwen3-0.6B``,
    ``transformers-tpu demo --model ...``) loads the tiny stand-in, as written: how the project runs its
    docs' examples (``tests/docs``), and how your CI can run yours. Use a cache directory of its own:
    the stand-in is the ``main`` revision of ``repo_id`` there. Returns the snapshot directory.
    """
    import hashlib

    if repo_id.count("/") != 1:
        raise ValueError(f"a Hub model id looks like 'org/name', got {repo_id!r}")
    repo = Path(cache_dir) / ("models--" + repo_id.replace("/", "--"))
    revision = hashlib.sha1(f"tiny:{repo_id}:{arch}:{seed}".encode()).hexdigest()
    snapshot = save_tiny_model(repo / "snapshots" / revision, arch=arch, seed=seed, **overrides)
    (repo / "refs").mkdir(parents=True, exist_ok=True)
    (repo / "refs" / "main").write_text(revision)
    return snapshot


def save_tiny_fp8_model(
    path: str | os.PathLike[str],
    arch: str = "qwen3",
    seed: int = 0,
    block: tuple[int, int] = (16, 16),
    **overrides: Any,
) -> Path:
    """Save a tiny FineGrainedFP8 checkpoint (and its tokenizer) to ``path``, as the Hub's FP8 checkpoints are.

    The model is :func:`tiny_model`'s; every linear layer but the output head is quantized by Transformers'
    own ``Fp8Quantize`` (``float8_e4m3fn`` weights, a float32 ``weight_scale_inv`` per block) and the config
    carries ``quantization_config = {"quant_method": "fp8", "weight_block_size": block, ...}``. The tiny
    models are 32 wide, so the blocks are 16x16 (real checkpoints use 128x128; the code is the same).
    Load it with ``from_pretrained(path)``; ``quantization_config=FineGrainedFP8Config(dequantize=True)``
    gives the same values in the model's dtype.
    """
    import types

    import torch
    from transformers import FineGrainedFP8Config
    from transformers.integrations.finegrained_fp8 import Fp8Quantize

    path = Path(path)
    tokenizer = tiny_tokenizer()
    model = tiny_model(arch, seed=seed, vocab_size=len(tokenizer), **overrides)
    config = FineGrainedFP8Config(weight_block_size=list(block))
    quantize = Fp8Quantize(types.SimpleNamespace(quantization_config=config))
    head = model.get_output_embeddings()
    state = dict(model.state_dict())
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.Linear) and module is not head:
            state.update(quantize._quantize_one(f"{name}.weight", module.weight.detach()))
    model.config.quantization_config = config.to_dict()
    model.save_pretrained(path, state_dict=state)
    tokenizer.save_pretrained(path)
    return path


def tiny_lm_dataset(
    num_examples: int = 96, min_length: int = 8, max_length: int = 120, seed: int = 0, vocab_size: int | None = None
) -> list[dict[str, list[int]]]:
    """A causal-LM training set: ``num_examples`` token lists of lengths drawn in ``[min_length, max_length]``.

    Seeded; token ids avoid 0 (padding) and 1 (end of sequence). Feed it to a ``Trainer`` with
    ``DataCollatorForLanguageModeling(tiny_tokenizer(), mlm=False)``, which pads each batch and
    copies the ids to the labels (padding ignored).
    """
    import torch

    vocab = vocab_size or len(tiny_tokenizer())
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(min_length, max_length + 1, (num_examples,), generator=gen).tolist()
    return [{"input_ids": torch.randint(2, vocab, (n,), generator=gen).tolist()} for n in lengths]


def tiny_preference_pairs(num_pairs: int = 12, max_words: int = 6, seed: int = 0) -> dict[str, list[str]]:
    """Preference pairs (``prompt``, ``chosen``, ``rejected``) of words from :data:`TINY_TEXT`, of varied lengths:
    a column dict for ``datasets.Dataset.from_dict``, the format TRL's ``DPOTrainer``, ``RewardTrainer``, ORPO
    and CPO read (KTO: each answer alone, with a ``label``). Seeded; no download."""
    import random

    words = " ".join(TINY_TEXT).split()
    rng = random.Random(seed)
    rows: dict[str, list[str]] = {"prompt": [], "chosen": [], "rejected": []}

    def span(low: int, high: int) -> str:
        start = rng.randrange(len(words))
        return " ".join((words * 2)[start: start + rng.randint(low, high)])

    for _ in range(num_pairs):
        rows["prompt"].append(span(2, max_words))
        rows["chosen"].append(" " + span(1, max_words))
        rows["rejected"].append(" " + span(1, max_words))
    return rows
