"""The pieces continuous batching runs with on TPU (used by ``patch_continuous_batching``).

- :func:`io_class` -> ``TPUBatchIO``: builds each step's inputs padded to a ``(Q, S)`` bucket
  (:func:`transformers_tpu_ext.serving.policy.step_shape`), in one host-to-device copy, with no stream.
- :func:`paged_cache_class` -> ``TPUPagedCache``: what the model sees as its cache during a step.
  ``update`` writes the new keys/values at their slots and returns, for every scheduled token, the
  pages of its request read through a fixed-width block table: ``[Q, max_len, kv_heads, head_dim]``.
  The KV length is data (positions), never a shape. Traceable, so the whole step is one graph.
- :func:`paged_attention`: each token attends to its request's pages up to its own position (and
  within a sliding window if the layer has one). It is never registered alone: a manager's model gets
  :func:`dispatching_attention` (``"tpu_paged|sdpa"``, ``"tpu_paged|eager"``), which runs it inside
  the manager's steps and the model's own attention everywhere else.

Nothing here is imported before Transformers is: the classes are built on first use.
"""

from __future__ import annotations

import copy
import functools
import logging
import time
from typing import Any

from . import policy as serving
from . import ragged

logger = logging.getLogger("transformers_tpu_ext")

ATTENTION_NAME = "tpu_paged"


def attention_name(original: str) -> str:
    """The name registered for a manager's model whose attention was ``original`` (``tpu_paged|sdpa``...)."""
    return f"{ATTENTION_NAME}|{original}"


@functools.cache
def dispatching_attention(original: str) -> Any:
    """The paged attention inside the manager's steps (their kwargs carry ``tpu_positions``), the
    ``original`` implementation (``"sdpa"`` or ``"eager"``) everywhere else.

    So a forward outside the manager (``generate()``, a plain call, a ``pause()`` block, another route
    of ``transformers serve``) computes what it computed before, with the masks it had (the same name
    is registered with ``original``'s mask function). The choice is made per call, from the call's
    own kwargs: safe with the manager's thread running next to the caller's, and resolved when a
    step is traced (the manager's graphs are unchanged). A plain function: it runs inside them.
    """
    import sys

    def attention(module: Any, query: Any, key: Any, value: Any, attention_mask: Any, *args: Any, **kwargs: Any) -> Any:
        if "tpu_kv_lens" in kwargs:  # the kernel path (serving.ragged)
            return ragged.attention(module, query, key, value, attention_mask, *args, **kwargs)
        if "tpu_positions" in kwargs:
            return paged_attention(module, query, key, value, attention_mask, *args, **kwargs)
        if original == "eager":  # the model file's own (soft-capping, dropout... as the model has them)
            fallback = sys.modules[type(module).__module__].eager_attention_forward
        else:
            from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

            fallback = ALL_ATTENTION_FUNCTIONS[original]
        return fallback(module, query, key, value, attention_mask, *args, **kwargs)

    attention.__name__ = attention.__qualname__ = f"tpu_paged_or_{original}"
    return attention


def paged_attention(
    module: Any,
    query: Any,  # [1, heads, Q, head_dim]
    key: Any,  # [Q, K, kv_heads, head_dim]: each token's pages, from TPUPagedCache.update
    value: Any,
    attention_mask: Any,
    scaling: float | None = None,
    dropout: float = 0.0,
    softcap: float | None = None,
    sliding_window: int | None = None,
    **kwargs: Any,
) -> tuple[Any, None]:
    import torch

    positions = kwargs["tpu_positions"].long()  # [Q]
    tokens, heads, head_dim = query.shape[2], query.shape[1], query.shape[3]
    kv_heads, length = key.shape[2], key.shape[1]
    groups = heads // kv_heads
    if scaling is None:
        scaling = head_dim**-0.5
    # Grouped-query attention without repeating the keys: [Q, kv_heads, groups, head_dim].
    q = query[0].transpose(0, 1).reshape(tokens, kv_heads, groups, head_dim)
    k = key.permute(0, 2, 3, 1)  # [Q, kv_heads, head_dim, K]
    v = value.transpose(1, 2)  # [Q, kv_heads, K, head_dim]
    scores = torch.matmul(q, k) * scaling  # [Q, kv_heads, groups, K]
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    key_positions = torch.arange(length, device=query.device)
    visible = key_positions[None, :] <= positions[:, None]
    if sliding_window is not None:
        visible = visible & (key_positions[None, :] > positions[:, None] - sliding_window)
    scores = scores.masked_fill(~visible[:, None, None, :], torch.finfo(scores.dtype).min)
    probs = torch.softmax(scores.float(), dim=-1).to(v.dtype)
    out = torch.matmul(probs, v)  # [Q, kv_heads, groups, head_dim]
    return out.reshape(1, tokens, heads, head_dim), None


@functools.cache
def paged_cache_class() -> type:
    from transformers.generation.continuous_batching.cache import PagedAttentionCache

    class TPUPagedCache(PagedAttentionCache):
        """The model's view of the paged cache during a TPU step (wraps the real one, shares its memory).

        A subclass only so that Transformers' mask code recognises a continuous-batching cache and
        builds no mask; it does not run ``PagedAttentionCache.__init__``.
        """

        def __init__(self, cache: Any, attention: str = "paged") -> None:  # noqa: D107 - see class docstring
            (allocator,) = cache.cache_allocators.values()
            self.paged = cache
            self.allocator = allocator
            self.page_size = allocator.tokens_per_page
            self.kernel_pages, self.kernel_rows = ragged.kernel_views(allocator) if attention == "ragged" else (None, None)

        def update(self, key_states: Any, value_states: Any, layer_idx: int, kwargs: Any = None) -> tuple[Any, Any]:
            import torch

            if "tpu_page_base" in kwargs:  # the kernel path: pages in the kernel's layout (serving.ragged)
                return ragged.update(self, key_states, value_states, layer_idx, kwargs)
            keys, values = self.allocator._kv_token_views[layer_idx]  # [slots, kv_heads, head_dim]
            write = kwargs["tpu_write_slots"].long()
            # Each token's pages: its request's row of the block table (first slot of each page),
            # plus the offsets inside a page. [Q, blocks * page_size]
            bases = kwargs["tpu_block_base"][kwargs["tpu_token_seq"].long()].long()
            offsets = torch.arange(self.page_size, device=bases.device)
            slots = (bases[:, :, None] + offsets).reshape(bases.shape[0], -1)
            scales = getattr(self.allocator, "_tpu_ext_kv_scales", None)
            if scales is not None:  # int8 pages: quantized on write, dequantized on gather
                from ..quantization import kv_cache

                first = 2 * self.allocator.layer_indices.index(layer_idx) * self.page_size  # where the views start
                return kv_cache.paged_update(
                    keys, values, scales, (first, first + self.page_size), write, slots, key_states, value_states
                )
            keys.index_copy_(0, write, key_states[0].transpose(0, 1).to(keys.dtype))
            values.index_copy_(0, write, value_states[0].transpose(0, 1).to(values.dtype))
            return keys[slots], values[slots]

    return TPUPagedCache


def int8_pages(args: tuple, kwargs: dict) -> tuple[tuple, dict, Any]:
    """``PagedAttentionCache(*args, **kwargs)``'s arguments with an int8 cache dtype, and the dtype it had
    (the model's: the activations keep it)."""
    import torch

    if len(args) > 4:
        return (*args[:4], torch.int8, *args[5:]), kwargs, args[4]
    return args, {**kwargs, "dtype": torch.int8}, kwargs.get("dtype", torch.float16)


def add_int8_scales(cache: Any) -> None:
    """Give each allocator of an int8 paged ``cache`` its float32 scale tensor (``quantization.kv_cache``)."""
    from ..quantization import kv_cache

    for allocator in cache.cache_allocators.values():
        allocator._tpu_ext_kv_scales = kv_cache.paged_scales(allocator)


def copy_int8_scales(allocator: Any, source_block_ids: list[int], dest_block_ids: list[int]) -> None:
    """After ``allocator.copy_blocks``: the same blocks' scales, for an int8 paged cache (else nothing)."""
    scales = getattr(allocator, "_tpu_ext_kv_scales", None)
    if scales is not None and source_block_ids:
        from ..quantization import kv_cache

        kv_cache.copy_scale_blocks(allocator, scales, source_block_ids, dest_block_ids)


@functools.cache
def io_class() -> type:
    import torch
    from transformers.generation.continuous_batching.input_outputs import ContinuousBatchingIOs
    from transformers.generation.continuous_batching.requests import TMP_TOKEN_ID

    class TPUBatchIO(ContinuousBatchingIOs):
        """Inputs and outputs of a continuous-batching step on TPU, synchronous (no stream).

        Replaces ``ContinuousBatchingIOs`` when the manager runs on a TPU; it allocates no
        ``[max_batch_tokens, cache]`` attention mask (the mask is computed from positions in the step).
        """

        def __init__(
            self,
            cache: Any,
            config: Any,
            continuous_batching_config: Any,
            device: Any,
            model_dtype: Any,
            logit_processor: Any,
        ) -> None:  # noqa: D107 - no super().__init__: nothing of upstream's static storage is needed
            self.plan: serving.ServingPlan = continuous_batching_config.tpu_plan
            self.cache, self.config, self.device, self.model_dtype = cache, config, device, model_dtype
            self.max_requests_per_batch = continuous_batching_config.max_requests_per_batch
            self.return_logprobs = continuous_batching_config.return_logprobs
            self.use_cuda_graph_varlen = False
            self.use_block_table = False
            self.compute_stream = None  # torch_tpu 0.2.0's stream context manager is non-functional
            if len(cache.cache_allocators) != 1:
                raise RuntimeError("TPU continuous batching expects one (full-attention) cache group")
            (self.allocator,) = cache.cache_allocators.values()
            self.view = paged_cache_class()(cache, self.plan.attention)
            self.logit_processor = logit_processor
            self.arg_defaults = torch.empty((logit_processor.tensors_required, 1), dtype=torch.int32)
            logit_processor.fill_defaults(self.arg_defaults)
            rows = 2 if self.return_logprobs else 1
            self.output_ids = torch.zeros((rows, self.plan.request_buckets[-1] + 1), dtype=torch.int32, device=device)
            self.carry_over_ids = torch.zeros((1,), dtype=torch.int32, device=device)  # unused: synchronous
            self._kwargs: dict | None = None
            self.reset()

        def reset(self) -> None:
            self.requests_in_batch = []
            self.req_id_to_new_token_position = {}
            self.num_request_in_batch = 0
            self.num_q_tokens = 0
            self.max_kv_read = 0

        def retrieve_device_outputs(self) -> None:
            return None  # synchronous: prepare_batch_update copies the new tokens back

        def prepare_batch_tensors(
            self,
            requests_in_batch: list,
            logits_processors: Any,
            use_decode_fast_path: bool,
            num_q_tokens: int,
            max_kv_read: int,
            use_padding: bool,
        ) -> None:
            if not requests_in_batch:
                raise ValueError("No requests in batch")
            allocator, width = self.allocator, self.plan.blocks_per_request
            stride = allocator.block_physical_stride
            ids: list[int] = []
            positions: list[int] = []
            token_seq: list[int] = []
            write: list[int] = []
            logits: list[int] = []
            bases: list[int] = []
            kv_lens, tables = [], []  # each request's tokens and block-table row (kernel path, byte counts)
            self.reset()
            for i, future in enumerate(requests_in_batch):
                state = future.state
                past, length = state.position_offset, future.query_length
                state.position_offset += length
                ids.extend(state.tokens_to_process)
                positions.extend(range(past, past + length))
                token_seq.extend([i] * length)
                write.extend(allocator.get_write_indices(state.request_id, past, length))
                blocks = allocator.block_table[state.request_id]
                if len(blocks) > width:
                    raise RuntimeError(
                        f"request {state.request_id} reached {past + length} tokens, past the TPU serving max length "
                        f"({self.plan.max_len})"
                    )
                bases.extend(block * stride for block in blocks)
                bases.extend([0] * (width - len(blocks)))  # the read-trash block
                kv_lens.append(past + length)
                tables.append(list(blocks) + [0] * (width - len(blocks)))
                if future.has_new_token:
                    logits.append(len(ids) - 1)
                    state.tokens_to_process = [TMP_TOKEN_ID]
                    self.req_id_to_new_token_position[state.request_id] = logits[-1]
                self.requests_in_batch.append(future)
            real_tokens, real_requests = len(ids), len(requests_in_batch)
            q, s = serving.step_shape(real_tokens, real_requests, self.plan.token_buckets, self.plan.request_buckets)
            args = self.arg_defaults.expand(-1, s).clone()
            logits_processors.prepare_tensor_args(requests_in_batch=requests_in_batch, arg_storage=args)
            kernel = None
            if self.plan.attention == "ragged":  # the kernel's write rows and page tables (serving.ragged)
                write, bases = ragged.step_inputs(self.allocator, write, tables)
                kernel = (kv_lens, real_requests)
            self._fill(
                q,
                s,
                ids=ids,
                positions=positions,
                token_seq=token_seq,
                write=write,
                logits=logits,
                bases=bases,
                args=args,
                kernel=kernel,
            )
            self.num_request_in_batch, self.num_q_tokens = real_requests, q
            self.plan.stats.record(real_tokens, real_requests, (q, s))
            self.plan.stats.record_kv(*ragged.kv_bytes(self.plan, self.allocator, kv_lens, q), real_tokens * (real_tokens == real_requests))

        def prepare_warmup_batch(self, q: int, s: int) -> None:
            """A step of shape ``(q, s)`` that reads and writes only the trash sectors."""
            self.reset()
            kernel = ([], 0) if self.plan.attention == "ragged" else None
            self._fill(q, s, ids=[], positions=[], token_seq=[], write=[], logits=[], bases=[],
                       args=self.arg_defaults.expand(-1, s).clone(), kernel=kernel)

        def _fill(self, q: int, s: int, *, ids, positions, token_seq, write, logits, bases, args, kernel=None) -> None:
            # Padding tokens: token 0 at position 0 of request 0, written to the write-trash sector,
            # reading the first key of request 0 (masked to itself): finite, and never read back.
            # The kernel path: padding sequences hold nothing (kv_len 0, no query token, past num_seqs).
            width = self.plan.blocks_per_request
            pad = q - len(ids)
            extra, write_trash = [], self.allocator.write_trash_index
            if kernel is not None:
                extra, write_trash = ragged.padded_arrays(self.allocator, kernel, token_seq, s)
            host = torch.cat(
                [
                    torch.tensor(ids + [0] * pad, dtype=torch.int32),
                    torch.tensor(positions + [0] * pad, dtype=torch.int32),
                    torch.tensor(token_seq + [0] * pad, dtype=torch.int32),
                    torch.tensor(write + [write_trash] * pad, dtype=torch.int32),
                    torch.tensor(logits + [0] * (s - len(logits)), dtype=torch.int32),
                    torch.tensor(bases + [0] * (s * width - len(bases)), dtype=torch.int32),
                    args.reshape(-1),
                    *(torch.tensor(values, dtype=torch.int32) for values in extra),
                ]
            )
            packed = host.to(self.device)  # the step's only host-to-device copy
            cut = [q, q, q, q, s, s * width, args.numel(), *(len(values) for values in extra)]
            parts, start = [], 0
            for size in cut:
                parts.append(packed[start : start + size])
                start += size
            ids_d, positions_d, seq_d, write_d, logits_d, bases_d, args_d = parts[:7]
            self._kwargs = {
                "input_ids": ids_d.view(1, q),
                "position_ids": positions_d.view(1, q),
                "attention_mask": None,
                "logits_indices": logits_d,
                "logits_processor_args": args_d.view(args.shape[0], s),
                "cache": self.view,
                "use_cache": False,
                "tpu_positions": positions_d,
                "tpu_token_seq": seq_d,
                "tpu_write_slots": write_d,
                "tpu_block_base": bases_d.view(s, width),
            }
            if kernel is not None:  # serving.ragged: the kernel's page table and ragged lengths
                self._kwargs.update(ragged.step_kwargs(self._kwargs.pop("tpu_block_base"), *parts[7:]))

        def get_model_kwargs(self, use_padding: bool = False) -> dict:
            return dict(self._kwargs) if self._kwargs is not None else {}

    return TPUBatchIO


def warmup(runner: Any, model: Any) -> None:
    """Run one step of every ``(Q, S)`` shape of the runner's plan (each compiles its graph), with a progress bar."""
    import torch

    from ..core.progress import Progress

    io = runner.inputs_and_outputs
    shapes = io.plan.shapes
    start = time.perf_counter()
    with torch.no_grad(), Progress(len(shapes), desc="transformers-tpu-ext: precompiling serving steps", unit="shape") as bar:
        for q, s in shapes:
            io.prepare_warmup_batch(q, s)
            runner.compute_batch(model, io.get_model_kwargs(use_padding=True))
            bar.step(f"compiled tokens={q} requests={s}")
    io.reset()
    logger.info(
        "transformers-tpu-ext: compiled %d continuous batching step shapes in %.1fs", len(shapes), time.perf_counter() - start
    )


def tpu_compile_config(config: Any) -> Any:
    """The user's CompileConfig made TPU-safe (backend ``tpu``, no mode, static shapes), or the default one."""
    from transformers import CompileConfig

    if config is None:
        return CompileConfig(backend="tpu", mode="default", fullgraph=False, dynamic=False)
    adapted = copy.copy(config)
    changes = []
    if isinstance(config.backend, str) and config.backend not in ("tpu", "eager", "aot_eager"):
        changes.append(f"backend={config.backend!r} -> 'tpu'")
        adapted.backend, adapted.options = "tpu", None
    if config.mode not in (None, "default"):
        changes.append(f"mode={config.mode!r} dropped")
        adapted.mode = "default"
    if config.dynamic is not False:
        changes.append("dynamic=False")
        adapted.dynamic = False
    if changes:
        from .. import log

        log.warn(
            "transformers-tpu-ext: the continuous batching CompileConfig cannot run on TPU; adapted it ("
            + ", ".join(changes)
            + ")",
            stacklevel=2,
        )
    return adapted
