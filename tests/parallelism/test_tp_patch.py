"""The ``tp_plan_rewrite`` and ``tp_kv_cache`` patches: the glue into Transformers, in process.

``_resolve_parallel_plans`` needs no process group, so these run in milliseconds on a tiny model built
from a config; the multi-process behaviour is in ``test_tp_multiprocess.py``. The patches act on a TPU
by default; the tests of the rewrite itself opt in for this CPU process with
``TRANSFORMERS_TPU_EXT_TP_REWRITE=always`` (fixture ``rewriting``), and the tests of the setting check
that without a TPU (or with ``never``) every call is upstream's.
"""

from __future__ import annotations

import contextlib
import logging

import pytest

import transformers_tpu_ext
from transformers_tpu_ext import testing
from transformers_tpu_ext.parallelism import tp_plans
from transformers_tpu_ext.registry import REGISTRY
from transformers_tpu_ext.parallelism import patch_tp_plan_rewrite as tp_plan_rewrite

ATTN = "model.layers.*.self_attn"
ENV = tp_plans.TP_REWRITE_ENV


@pytest.fixture(scope="module")
def transformers_mixin():
    import transformers.generation.utils  # noqa: F401 - fires the tp_kv_cache hook
    import transformers.modeling_utils  # noqa: F401 - fires the post-import hook
    from transformers.distributed import mixin

    active = transformers_tpu_ext.active_patches()
    assert "tp_plan_rewrite" in active and "tp_kv_cache" in active, transformers_tpu_ext.skipped_patches()
    return mixin


@pytest.fixture
def rewriting(transformers_mixin, monkeypatch):
    """The documented opt-in for CPU/GPU: rewrite on any device."""
    monkeypatch.setenv(ENV, "always")
    return transformers_mixin


@contextlib.contextmanager
def _no_tpu():
    """This process sees no TPU, even if another test installed the simulated one."""
    sim = testing.simulated_tpu()
    with sim.hidden() if sim is not None else contextlib.nullcontext():
        from transformers_tpu_ext import backend

        assert not backend.tpu_available()
        yield


def _tiny_llama(heads: int, kv_heads: int):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=64,
        hidden_size=heads * 8,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=8,
    )
    with torch.device("meta"):
        return LlamaForCausalLM(config)


def _resolve(model, **config):
    from transformers.distributed import DistributedConfig

    tp_plan, _, _ = model._resolve_parallel_plans(DistributedConfig(**config))
    return tp_plan


def test_patch_contract():
    assert "tp_plan_rewrite" in REGISTRY
    assert tp_plan_rewrite.NAME == "tp_plan_rewrite"
    assert tp_plan_rewrite.TARGET == "transformers.distributed.mixin"
    assert tp_plan_rewrite.DISTRIBUTION == "transformers"


def test_revert_restores_the_exact_originals_and_apply_again(rewriting):
    from transformers.distributed.parallel_utils import ALL_PARALLEL_STYLES, ParallelInterface

    cls = rewriting.DistributedMixin
    wrapped = cls.__dict__["_resolve_parallel_plans"]
    original = wrapped.__wrapped__
    _resolve(_tiny_llama(heads=6, kv_heads=3), tp_size=2)  # the first rewrite registers the style
    assert tp_plans.KV_REPLICATED_STYLE in ALL_PARALLEL_STYLES
    tp_plan_rewrite.revert()
    try:
        assert cls.__dict__["_resolve_parallel_plans"] is original
        assert tp_plans.KV_REPLICATED_STYLE not in ParallelInterface._global_mapping
    finally:
        tp_plan_rewrite.apply(rewriting)
    assert cls.__dict__["_resolve_parallel_plans"].__wrapped__ is original
    assert tp_plans.KV_REPLICATED_STYLE not in ALL_PARALLEL_STYLES  # registered when a rewrite runs
    _resolve(_tiny_llama(heads=6, kv_heads=3), tp_size=2)
    assert tp_plans.KV_REPLICATED_STYLE in ALL_PARALLEL_STYLES
    tp_plan_rewrite.apply(rewriting)  # idempotent: no double wrapping
    assert cls.__dict__["_resolve_parallel_plans"].__wrapped__ is original


def test_resolved_plan_replicates_attention_and_logs_once(rewriting, caplog):
    model = _tiny_llama(heads=6, kv_heads=3)
    with caplog.at_level(logging.WARNING, logger="transformers_tpu_ext"):
        plan = _resolve(model, tp_size=2)
    assert plan["model.layers.0.self_attn.k_proj"] == "replicate"
    assert plan["model.layers.0.mlp.gate_proj"] == "colwise"
    assert model.tp_plan[f"{ATTN}.q_proj"] == "replicate"
    lines = [r.getMessage() for r in caplog.records if "TP plan rewritten" in r.getMessage()]
    assert len(lines) == 1 and "LlamaForCausalLM" in lines[0] and "kv_heads" in lines[0]


def test_user_config_is_not_mutated_and_user_entries_win(rewriting):
    from transformers.distributed import DistributedConfig

    model = _tiny_llama(heads=6, kv_heads=3)
    user = {f"{ATTN}.q_proj": "replicate", f"{ATTN}.k_proj": "replicate", f"{ATTN}.v_proj": "replicate", f"{ATTN}.o_proj": "replicate"}
    distributed_config = DistributedConfig(tp_size=2, tp_plan=dict(user))
    plan, _, _ = model._resolve_parallel_plans(distributed_config)
    assert distributed_config.tp_plan == user
    assert all(plan[f"model.layers.0.self_attn.{n}"] == "replicate" for n in ("q_proj", "k_proj", "v_proj", "o_proj"))


def test_unknown_user_key_still_rejected_by_transformers(rewriting):
    model = _tiny_llama(heads=6, kv_heads=3)
    with pytest.raises(ValueError, match="match nothing"):
        _resolve(model, tp_size=2, tp_plan={"model.layers.*.self_attn.nope": "colwise"})


def test_impossible_plan_raises(rewriting):
    model = _tiny_llama(heads=6, kv_heads=3)
    with pytest.raises(tp_plans.TPPlanError, match="num_key_value_heads=3"):
        _resolve(model, tp_size=2, tp_plan={f"{ATTN}.k_proj": "colwise"})


def test_divisible_plan_passes_through(rewriting):
    model = _tiny_llama(heads=4, kv_heads=2)
    assert _resolve(model, tp_size=2)["model.layers.0.self_attn.k_proj"] == "colwise"


def test_a_failing_rewriter_falls_back_to_the_upstream_plan(rewriting, caplog):
    def broken(ctx):
        raise RuntimeError("boom")

    tp_plans.register_rewriter("test_broken", broken)
    try:
        model = _tiny_llama(heads=4, kv_heads=2)
        with caplog.at_level(logging.WARNING, logger="transformers_tpu_ext"):
            plan = _resolve(model, tp_size=2)
    finally:
        tp_plans.unregister_rewriter("test_broken")
    assert plan["model.layers.0.self_attn.k_proj"] == "colwise"
    assert any("boom" in record.getMessage() for record in caplog.records)


# --------------------------------------------------------------------------------------------------
# Where the patches act: TRANSFORMERS_TPU_EXT_TP_REWRITE (auto = TPU only, always, never)

# The reviewer's case: 2 KV heads on 4 ranks (upstream keeps k_proj colwise), and a user plan that
# upstream accepts at load time (and fails later) but the rewrite rejects with TPPlanError.
_KV2_USER_PLAN = {f"{ATTN}.k_proj": "colwise", f"{ATTN}.q_proj": "colwise"}


def _upstream(transformers_mixin, **config):
    """What Transformers itself resolves: the patch reverted for the call, then applied again."""
    tp_plan_rewrite.revert()
    try:
        model = _tiny_llama(heads=4, kv_heads=2)
        return _resolve(model, **config), dict(model.tp_plan)
    finally:
        tp_plan_rewrite.apply(transformers_mixin)


def _patched(**config):
    model = _tiny_llama(heads=4, kv_heads=2)
    return _resolve(model, **config), dict(model.tp_plan)


@pytest.mark.parametrize("setting", [None, "auto", " AUTO ", "never"])
def test_without_a_tpu_the_plans_are_upstreams(transformers_mixin, monkeypatch, caplog, setting):
    from transformers.distributed.parallel_utils import ALL_PARALLEL_STYLES

    if setting is None:
        monkeypatch.delenv(ENV, raising=False)
    else:
        monkeypatch.setenv(ENV, setting)
    with _no_tpu():
        upstream_default = _upstream(transformers_mixin, tp_size=4)
        upstream_user = _upstream(transformers_mixin, tp_size=4, tp_plan=dict(_KV2_USER_PLAN))
        with caplog.at_level(logging.WARNING, logger="transformers_tpu_ext"):
            assert _patched(tp_size=4) == upstream_default
            assert _patched(tp_size=4, tp_plan=dict(_KV2_USER_PLAN)) == upstream_user  # no TPPlanError
            # The style is not registered: naming it gets Transformers' own error.
            with pytest.raises(ValueError, match="Unsupported `tp_plan` styles"):
                _patched(tp_size=4, tp_plan={f"{ATTN}.k_proj": tp_plans.KV_REPLICATED_STYLE})
    assert upstream_default[0]["model.layers.0.self_attn.k_proj"] == "colwise"
    assert tp_plans.KV_REPLICATED_STYLE not in ALL_PARALLEL_STYLES
    assert not [r for r in caplog.records if "transformers-tpu-ext" in r.getMessage()]


def test_always_rewrites_without_a_tpu(rewriting, caplog):
    from transformers.distributed.parallel_utils import ALL_PARALLEL_STYLES

    with _no_tpu():
        with caplog.at_level(logging.WARNING, logger="transformers_tpu_ext"):
            plan = _resolve(_tiny_llama(heads=6, kv_heads=3), tp_size=2)
        with pytest.raises(tp_plans.TPPlanError, match="num_key_value_heads=2"):
            _patched(tp_size=4, tp_plan=dict(_KV2_USER_PLAN))
    assert plan["model.layers.0.self_attn.k_proj"] == "replicate"
    assert tp_plans.KV_REPLICATED_STYLE in ALL_PARALLEL_STYLES
    assert any("TP plan rewritten" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("setting, rewritten", [(None, True), ("never", False)])
def test_on_a_tpu_the_default_rewrites(transformers_mixin, simulated_tpu, monkeypatch, setting, rewritten):
    if setting is None:
        monkeypatch.delenv(ENV, raising=False)
    else:
        monkeypatch.setenv(ENV, setting)
    plan = _resolve(_tiny_llama(heads=6, kv_heads=3), tp_size=2)
    assert plan["model.layers.0.self_attn.k_proj"] == ("replicate" if rewritten else "colwise")
    with simulated_tpu.hidden():  # the same process, its TPU hidden: upstream again
        plan = _resolve(_tiny_llama(heads=6, kv_heads=3), tp_size=2)
    assert plan["model.layers.0.self_attn.k_proj"] == "colwise"


@pytest.mark.parametrize("setting, heads", [(None, 2), ("auto", 2), ("never", 2), ("always", 1)])
def test_static_cache_sizing_follows_the_setting(transformers_mixin, monkeypatch, setting, heads):
    from transformers.generation import utils

    if setting is None:
        monkeypatch.delenv(ENV, raising=False)
    else:
        monkeypatch.setenv(ENV, setting)
    plan = {f"{ATTN}.q_proj": "colwise", f"{ATTN}.k_proj": tp_plans.KV_REPLICATED_STYLE}
    with _no_tpu():
        assert utils.get_kv_heads_per_rank(plan, 2, 4) == heads  # upstream: every KV head


def test_an_invalid_setting_is_a_clear_error(transformers_mixin, monkeypatch):
    from transformers.generation import utils

    monkeypatch.setenv(ENV, "tpu")
    with _no_tpu():
        with pytest.raises(ValueError, match=r"TRANSFORMERS_TPU_EXT_TP_REWRITE='tpu'.*auto, always, never"):
            _patched(tp_size=4)
        with pytest.raises(ValueError, match="TRANSFORMERS_TPU_EXT_TP_REWRITE"):
            utils.get_kv_heads_per_rank({f"{ATTN}.k_proj": "colwise"}, 2, 4)


def test_the_kv_replicated_style_takes_what_the_installed_transformers_passes(rewriting):
    """Transformers 5.25's apply_tensor_parallelism passes ``config=`` and ``mesh_manager=`` to every style's
    shard_param and install_forward (5.23-5.24 pass neither): the style takes the arguments of the installed
    release's base class, whatever they are."""
    import inspect

    from transformers.distributed.parallel_utils import ALL_PARALLEL_STYLES
    from transformers.distributed.tensor_parallel import TensorParallelLayer

    _resolve(_tiny_llama(heads=6, kv_heads=3), tp_size=2)  # the first rewrite registers the style
    style = ALL_PARALLEL_STYLES[tp_plans.KV_REPLICATED_STYLE]
    for method in ("shard_param", "install_forward"):
        upstream = inspect.signature(getattr(TensorParallelLayer, method))
        passed = [p for p in list(upstream.parameters.values())[1:] if p.kind is not p.VAR_KEYWORD]
        args = [object() for p in passed if p.kind is p.POSITIONAL_OR_KEYWORD]
        kwargs = {p.name: None for p in passed if p.kind is p.KEYWORD_ONLY}
        inspect.signature(getattr(style, method)).bind(*args, **kwargs)  # TypeError before 5.25 was handled
