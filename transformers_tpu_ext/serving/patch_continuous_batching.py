"""Patch of Transformers' continuous batching: ``generate_batch``, the manager and ``transformers serve`` on TPU.

Thin wrappers; each falls straight through unless the manager's model is on a TPU (a
``ContinuousBatchingManager`` built there carries a ``tpu_plan`` on its resolved config):

- ``ContinuousBatchingManager.__init__``: decides whether the manager takes the TPU path
  (``serving.paged_path``: otherwise it is upstream's, unpatched), plans it (shapes, page size, max
  length, HBM) and gives the model the dispatching attention (``"tpu_paged|sdpa"``...: the paged
  kernel inside the manager's steps, the model's own attention everywhere else; restored by
  ``stop()`` as upstream restores its own, by ``destroy()`` for a manager never started, and by
  ``generate_batch()`` however it ends: ``wrap_attention``).
- ``resolve_continuous_batching_config``: step shapes from the bucket ladders, the ``tpu`` compile
  backend (a CompileConfig it would reject is adapted, with one warning), no CUDA graphs, no
  asynchronous batching (streams do not work on torch_tpu 0.2.0).
- ``ContinuousBatchingIOs`` (the name the batch processor builds): ``TPUBatchIO`` on TPU.
- ``PagedAttentionMemoryHandler``: the cache is sized from the chip's HBM (not host RAM).
- ``PagedAttentionCache.__init__`` / ``group_layers_by_attn_type``: one full-attention cache group
  (sliding windows are applied by the attention's mask); with the int8 KV cache
  (``serving.kv_cache_path``), int8 pages and a parallel float32 scale tensor, whose blocks
  ``CacheAllocator.copy_blocks`` copies with the pages' (a forked request): ``wrap_cache``.
- the steps' attention: JAX's ragged paged attention kernel where ``kernel_path.attention_path`` allows it.
- ``ModelRunner.warmup``: compiles every ``(Q, S)`` step shape, with a progress bar.
- ``ModelRunner.compute_batch``: a kernel that fails in a step (warm-up or serving) sends the manager to the
  plain-PyTorch attention, with one warning, and the step runs again: ``wrap_fallback``.
- ``ContinuousBatchingLogitsProcessorList.__init__``: a manager that samples reads temperature, top-k
  and top-p per request from a tensor of the step (``serving.sampling.per_request_path``), not from
  numbers compiled into its programs.
- ``ContinuousBatchingManager.start``: warms up first if nothing did (``transformers serve``).
- ``ContinuousBatchingManager.add_request``: a request longer than the max length, or than the paged
  cache's whole pool (``serving.pool``), is refused early (within ``add_requests``, ``generate_batch``:
  delivered as a failed result, the others served); ``Scheduler.add_waiting_request``: the same pool
  check for a request added before the cache existed (it fails alone).

The policy (ladders, shapes, page size, cache sizing) is plain logic in ``transformers_tpu_ext.serving.policy``.
"""

from __future__ import annotations

import contextvars
import logging
import sys
from typing import Any

from . import policy as serving
from .plan import plan_of as _plan_of
from . import sampling
from . import tensor_parallel
from . import wrap_attention as attention
from . import wrap_cache as cache
from . import wrap_fallback as fallback
from . import wrap_requests as requests
from ..backend import chip_info, is_tpu
from ..compilation import recompile_limit
from ..core.relies import Attribute, Signature
from ..core.wrapping import Wraps, warn_once

NAME = "continuous_batching"
TARGET = "transformers.generation.continuous_batching.continuous_api"
DISTRIBUTION = "transformers"
_CB = "transformers.generation.continuous_batching"
RELIES_ON = (
    # The manager and the mixin: what each wrapper reads of its arguments (args[i] or by name).
    Signature("ContinuousBatchingManager.__init__", positional=("model", "generation_config", "continuous_batching_config")),
    Signature("ContinuousBatchingManager.switch_to_cb_friendly_attn", positional=("model",)),
    Signature("ContinuousBatchingManager.add_request", positional=("input_ids", "request_id", "max_new_tokens")),
    *(Signature(f"ContinuousBatchingManager.{name}") for name in ("start", "destroy", "add_requests", "is_running", "warmup")),
    Signature("ContinuousBatchingManager.stop", ("block", "timeout", "hard_stop")),
    Signature("ContinuousMixin.generate_batch"),
    Signature("OutputRouter.fail_and_deliver", positional=("state", "error")),
    # The resolved config: called by keyword; the plan sets these fields, and a CompileConfig of its own.
    Signature("resolve_continuous_batching_config", ("config", "workload_hints", "device")),
    *(Attribute(f"ContinuousBatchingConfig.{name}") for name in (
        "page_size", "max_batch_tokens", "max_requests_per_batch", "max_blocks_per_request", "use_cuda_graph",
        "use_async_batching", "varlen_compile_config", "decode_compile_config", "return_logprobs")),
    Signature("transformers.generation.configuration_utils:CompileConfig", ("backend", "mode", "fullgraph", "dynamic")),
    # A step: TPUBatchIO takes ContinuousBatchingIOs' arguments and replaces the methods upstream calls.
    Signature("ContinuousBatchingIOs", positional=("cache", "config", "continuous_batching_config", "device", "model_dtype",
                                                   "logit_processor")),
    Signature("ContinuousBatchingIOs.prepare_batch_tensors", positional=(
        "requests_in_batch", "logits_processors", "use_decode_fast_path", "num_q_tokens", "max_kv_read", "use_padding")),
    Signature("ContinuousBatchingIOs.get_model_kwargs", ("use_padding",)),
    Signature("ContinuousBatchingIOs.retrieve_device_outputs"),
    Signature("ModelRunner.warmup", positional=("model",)),
    Signature("ModelRunner.compute_batch", positional=("model", "batch_data")),
    Signature("ContinuousBatchingLogitsProcessorList.__init__", positional=(
        "logits_processor", "per_request_processors", "drop_unsupported_processors")),
    Signature("ContinuousBatchingLogitsProcessorList.prepare_tensor_args", ("requests_in_batch", "arg_storage")),
    # The paged cache (wrap_cache; runtime.int8_pages reads args[4] / dtype=, local_kv_heads args[3] / distributed_helper=).
    Signature(f"{_CB}.cache:PagedAttentionCache.__init__", positional=(
        "config", "continuous_batching_config", "device", "distributed_helper", "dtype")),
    Signature(f"{_CB}.cache:PagedAttentionCache.update", positional=("key_states", "value_states", "layer_idx", "kwargs")),
    Signature(f"{_CB}.cache:group_layers_by_attn_type"),
    *(Signature(f"{_CB}.cache:PagedAttentionMemoryHandler.{name}") for name in (
        "get_available_memory", "infer_max_batch_tokens_and_num_sectors", "num_sectors_from_config")),
    Attribute(f"{_CB}.cache:PagedAttentionMemoryHandler.bytes_per_batch_token"),
    Signature(f"{_CB}.cache_allocators.cache_allocator:CacheAllocator.copy_blocks", ("source_block_ids", "dest_block_ids")),
    Signature(f"{_CB}.cache_allocators.cache_allocator:CacheAllocator.get_write_indices", positional=(
        "request_id", "past_length", "query_length")),
    Signature(f"{_CB}.utils:find_head_dim", positional=("config",)),
    Signature(f"{_CB}.distributed:DistributedHelper.extract_tp_mesh", positional=("device_mesh",)),
    # The requests (wrap_requests: Scheduler.add_waiting_request reads args[0] / state=, lowers its max_new_tokens).
    Signature(f"{_CB}.scheduler:Scheduler.add_waiting_request", positional=("state",)),
    Signature(f"{_CB}.requests:RequestState", ("request_id", "initial_tokens", "max_new_tokens")),
    Attribute(f"{_CB}.requests:RequestState._new_tokens_limit"),  # derived from max_new_tokens by __post_init__
    # PreTrainedModel.set_attn_implementation is in transformers.modeling_utils, which may still be importing
    # when this target is: not checked here.
)

logger = logging.getLogger("transformers_tpu_ext")

_wraps = Wraps()


class _Init:
    """What the ``__init__`` wrapper knows while upstream's ``__init__`` runs (read by the resolve wrapper)."""

    def __init__(self, model: Any, settings: serving.ServeSettings, user_config: Any, generation_config: Any = None) -> None:
        self.model, self.settings, self.user_config = model, settings, user_config
        self.generation_config = generation_config
        #: Upstream's arguments of the logits processor list when the plugin switched them (per request).
        self.upstream_processors: tuple[tuple, dict] | None = None
        chip = chip_info()
        from ..placement.budget import headroom_bytes

        self.hbm = chip.total_memory if chip else 0
        self.headroom = headroom_bytes(self.hbm)
        self.resident = _resident_bytes(model)


_init: contextvars.ContextVar[_Init | None] = contextvars.ContextVar("tpu_ext_cb_init", default=None)


def apply(module: Any) -> None:
    cache_module = sys.modules["transformers.generation.continuous_batching.cache"]
    manager = module.ContinuousBatchingManager
    _wraps.wrap(manager, "__init__", _manager_init)
    _wraps.wrap(manager, "switch_to_cb_friendly_attn", attention.switch_attention)
    _wraps.wrap(manager, "start", _start)
    _wraps.wrap(manager, "destroy", attention.destroy)
    _wraps.wrap(manager, "add_request", requests.add_request)
    _wraps.wrap(manager, "add_requests", requests.add_requests)
    _wraps.wrap(module.ContinuousMixin, "generate_batch", attention.generate_batch)
    _wraps.wrap(module, "resolve_continuous_batching_config", _resolve)
    _wraps.wrap(module, "ContinuousBatchingIOs", _make_ios)
    _wraps.wrap(module.ModelRunner, "warmup", _runner_warmup)
    _wraps.wrap(module.ModelRunner, "compute_batch", fallback.compute_batch)
    _wraps.wrap(module.ContinuousBatchingLogitsProcessorList, "__init__", _processor_list)
    _wraps.wrap(cache_module.PagedAttentionCache, "__init__", cache.cache_init)
    _wraps.wrap(cache_module, "group_layers_by_attn_type", cache.group_layers)
    scheduler = sys.modules["transformers.generation.continuous_batching.scheduler"]
    _wraps.wrap(scheduler.Scheduler, "add_waiting_request", requests.add_waiting_request)
    allocators = sys.modules["transformers.generation.continuous_batching.cache_allocators.cache_allocator"]
    _wraps.wrap(allocators.CacheAllocator, "copy_blocks", cache.copy_blocks)
    handler = cache_module.PagedAttentionMemoryHandler
    _wraps.wrap(handler, "get_available_memory", cache.available_memory)
    _wraps.wrap(handler, "infer_max_batch_tokens_and_num_sectors", cache.infer_sizes)


def revert() -> None:
    _wraps.unwrap_all()
    attention.forget()
    recompile_limit.release("serve")


def _step_io() -> Any:
    from . import step_io

    return step_io


def _runtime() -> Any:
    from . import runtime as _cb_runtime

    return _cb_runtime



# -------------------------------------------------------------------------------------------------
# The manager


def _manager_init(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    model = args[0] if args else kwargs.get("model")
    if not is_tpu(getattr(model, "device", None)):
        return wrapped(*args, **kwargs)
    taken, why = serving.paged_path(_serve_facts(model))
    if not taken:
        warn_once(f"continuous batching on TPU runs unpatched for this model: {why}")
        if serving.current().kv_cache:
            warn_once(serving.kv_cache_path("int8", paged=False, dtype="")[1])
        return wrapped(*args, **kwargs)
    # The user's own mistakes (a bad TRANSFORMERS_TPU_EXT_SERVE_* or HBM headroom value) raise here.
    settings = serving.current()
    user_config = args[2] if len(args) > 2 else kwargs.get("continuous_batching_config")
    generation_config = args[1] if len(args) > 1 else kwargs.get("generation_config")
    init = _Init(model, settings, user_config, generation_config)
    token = _init.set(init)
    try:
        wrapped(*args, **kwargs)
    finally:
        _init.reset(token)
    if _plan_of(instance.continuous_batching_config) is not None:
        attention.made(instance)
        attention.use_tpu_attention(instance, model)
    elif init.upstream_processors is not None:  # planning failed: upstream's manager, upstream's processors
        processor_args, processor_kwargs = init.upstream_processors
        instance.logit_processor = type(instance.logit_processor)(*processor_args, **processor_kwargs)


def _serve_facts(model: Any) -> serving.ServeFacts:
    import torch

    from ..generation.static_cache import text_layer_types

    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    return serving.ServeFacts(
        tp=_tp_facts(model),
        encoder_decoder=bool(model.config.is_encoder_decoder),
        attention=attention.user_attention(model),
        layer_types=text_layer_types(model),
        attention_sinks=any(isinstance(getattr(module, "sinks", None), torch.Tensor) for module in model.modules()),
        eager_function=hasattr(sys.modules.get(type(model).__module__), "eager_attention_forward"),
        latent_cache=str(config.model_type) if getattr(config, "kv_lora_rank", None) is not None else "",
        media=_media(model.config),
    )


def _media(config: Any) -> str | None:
    """What a model reads besides text, from its config's sub-configs (``serving.ServeFacts.media``)."""
    found = [what for name, what in (("vision_config", "images"), ("audio_config", "audio")) if getattr(config, name, None) is not None]
    return " and ".join(found) or None


def _tp_facts(model: Any) -> serving.TPFacts:
    """The model's tensor parallelism as upstream's manager sees it (its ``DistributedHelper``'s TP mesh)."""
    from transformers.generation.continuous_batching.distributed import DistributedHelper

    from ..parallelism.heads import head_counts

    mesh = DistributedHelper.extract_tp_mesh(getattr(model, "_device_mesh", None))
    if mesh is None:
        return serving.TPFacts()
    heads, kv_heads = head_counts(model.config) or (0, 0)
    styles = tensor_parallel.attention_styles(dict(getattr(model, "tp_plan", None) or {}))
    return serving.TPFacts(tp_size=int(mesh.size()), heads=heads, kv_heads=kv_heads, attention=styles)


def _start(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    plan = _plan_of(instance.continuous_batching_config)
    if plan is not None and plan.warmup and not instance.warmed_up and not instance.is_running():
        instance.warmup()  # transformers serve starts the manager without a warm-up
    return wrapped(*args, **kwargs)


def _resolve(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    init = _init.get()
    resolved = wrapped(*args, **kwargs)
    if init is None or not is_tpu(kwargs.get("device")):
        return resolved
    try:
        _plan_manager(resolved, init, kwargs.get("config"), kwargs.get("workload_hints"))
    except Exception as error:  # a bug of ours: upstream continuous batching, unpatched
        warn_once(f"planning continuous batching on TPU failed ({type(error).__name__}: {error}); running it unpatched")
        resolved.__dict__.pop("tpu_plan", None)
    return resolved


def _plan_manager(resolved: Any, init: _Init, config: Any, hints: Any) -> None:
    user = init.user_config
    hint_len = (hints.max_prompt_length + hints.max_generated_length) if hints is not None else 0
    default_page = type(resolved)().page_size
    plan = serving.plan_for(
        init.settings,
        hint_len=hint_len or None,
        model_max_len=getattr(config, "max_position_embeddings", None),
        page_size=resolved.page_size if resolved.page_size != default_page else None,
        max_batch_tokens=getattr(user, "max_batch_tokens", None),
        max_requests=getattr(user, "max_requests_per_batch", None),
        hbm_bytes=init.hbm,
        resident_bytes=init.resident,
        headroom_bytes=init.headroom,
    )
    for note in plan.notes:
        warn_once(note)
    if getattr(user, "use_async_batching", None):
        warn_once("asynchronous batching needs device streams, which torch_tpu 0.2.0 does not provide; running synchronously")
    resolved.page_size = plan.page_size
    resolved.max_batch_tokens = plan.max_batch_tokens
    resolved.max_requests_per_batch = plan.max_requests
    resolved.max_blocks_per_request = 0  # upstream's flash decode path; ours reads pages on its own
    resolved.use_cuda_graph = (False, False)
    resolved.use_async_batching = False
    resolved.varlen_compile_config = _runtime().tpu_compile_config(getattr(user, "varlen_compile_config", None))
    resolved.decode_compile_config = None
    # every step shape is a recompilation of one function (past the limit TorchDynamo runs it eagerly)
    recompile_limit.require("serve", len(plan.shapes))
    facts = _serve_facts(init.model)
    plan.kv_cache, why = serving.kv_cache_path(
        init.settings.kv_cache, paged=True, dtype=str(init.model.dtype).removeprefix("torch."), latent=bool(facts.latent_cache)
    )
    logger.debug("transformers-tpu-ext: TPU paged cache format %s: %s", plan.kv_cache or "the model's dtype", why)
    from . import ragged

    local = None
    if facts.tp.tp_size > 1:  # each rank's own heads (serving.tensor_parallel)
        local, plan.kv_head_split = tensor_parallel.local_heads(facts.tp), tensor_parallel.kv_split(facts.tp)
        plan.local_heads = local
    if facts.latent_cache:  # the kernel reads keys and values; the model expands the latents it is given itself
        ragged.describe("paged", "multi-head latent attention (the kernel takes keys and values, not latents)")
        plan.attention, plan.kernel_variant = "paged", None
    else:
        plan.attention, plan.kernel_variant = ragged.choose(
            init.model, init.settings.attention, plan.kv_cache, facts.attention_sinks, local, page_size=plan.page_size
        )
    resolved.tpu_plan = plan


def _processor_list(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    """The manager's logits processors: per request (``serving.sampling.per_request_path``) on the TPU path."""
    init = _init.get()
    if init is None:
        return wrapped(*args, **kwargs)
    bound = {**dict(zip(("logits_processor", "per_request_processors", "drop_unsupported_processors"), args)), **kwargs}
    processors = list(bound["logits_processor"])
    facts = sampling.SamplingFacts(
        tpu_path=True,
        do_sample=bool(getattr(init.generation_config, "do_sample", False)),
        processors=tuple(type(p).__name__ for p in processors),
        upstream_classes=all(type(p).__module__.startswith("transformers.") for p in processors),
    )
    taken, why = sampling.per_request_path(facts)
    logger.debug("transformers-tpu-ext: continuous batching logits processors: %s", why)
    if not taken:
        return wrapped(*args, **kwargs)
    from transformers.generation import logits_process

    made = [
        processors[p] if isinstance(p, int) else getattr(logits_process, p)(sampling.IDENTITY[p])
        for p in sampling.completed(facts.processors)
    ]
    init.upstream_processors = (args, kwargs)
    bound.update(logits_processor=logits_process.LogitsProcessorList(made), per_request_processors=True)
    return wrapped(**bound)


def _make_ios(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    """The batch processor's ``ContinuousBatchingIOs(**kwargs)``: ``TPUBatchIO`` for a planned manager."""
    if _plan_of(kwargs.get("continuous_batching_config")) is not None:
        return _step_io().io_class()(*args, **kwargs)
    return wrapped(*args, **kwargs)


def _resident_bytes(model: Any) -> int:
    """Bytes of the model's parameters and buffers on the TPU (a tied tensor counted once; quantized tensor
    subclasses by their inner tensors: torchao's report their outer dtype and ``data_ptr() == 0``)."""
    from ..quantization.runtime import resident_bytes

    return resident_bytes([*model.parameters(), *model.buffers()], is_tpu)


# -------------------------------------------------------------------------------------------------
# Warm-up: every (Q, S) step shape, once


def _runner_warmup(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    if not isinstance(instance.inputs_and_outputs, _step_io().io_class()):
        return wrapped(*args, **kwargs)
    recompile_limit.require("serve", len(instance.inputs_and_outputs.plan.shapes))
    return _runtime().warmup(instance, args[0] if args else kwargs["model"])
