"""The inputs and outputs of a continuous-batching step on TPU: ``TPUBatchIO`` (:func:`io_class`).

Upstream's ``ContinuousBatchingIOs`` with the steps below: the step's tokens, positions, write slots
and block bases padded to the plan's ``(Q, S)`` shape and copied to the device in one transfer; the
model reads them through the paged cache view (:func:`.runtime.paged_cache_class`). Built on first use:
nothing here is imported before Transformers is.
"""

from __future__ import annotations

import functools
from typing import Any

from . import policy as serving
from . import ragged
from .runtime import latent_kv_bytes, paged_cache_class

__all__ = ["io_class"]


# The steps of ``TPUBatchIO`` (methods of the class :func:`io_class` builds on first use).


def _io_init(
    self,
    cache: Any,
    config: Any,
    continuous_batching_config: Any,
    device: Any,
    model_dtype: Any,
    logit_processor: Any,
) -> None:  # noqa: D107 - no super().__init__: nothing of upstream's static storage is needed
    import torch

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


def _io_reset(self) -> None:
    self.requests_in_batch = []
    self.req_id_to_new_token_position = {}
    self.num_request_in_batch = 0
    self.num_q_tokens = 0
    self.max_kv_read = 0


def _io_retrieve_device_outputs(self) -> None:
    return None  # synchronous: prepare_batch_update copies the new tokens back


def _io_prepare_batch_tensors(
    self,
    requests_in_batch: list,
    logits_processors: Any,
    use_decode_fast_path: bool,
    num_q_tokens: int,
    max_kv_read: int,
    use_padding: bool,
) -> None:
    from transformers.generation.continuous_batching.requests import TMP_TOKEN_ID

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
    # the present path's inputs: what a kernel that fails in this step falls back to (refill_present)
    self._present = dict(ids=ids, positions=positions, token_seq=token_seq, write=write, logits=logits, bases=bases, args=args)
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
    if hasattr(self.allocator, "_latent_token_views"):  # multi-head latent attention: each request reads its rows
        kv = latent_kv_bytes(self.plan, self.allocator, kv_lens, s)
    else:
        kv = ragged.kv_bytes(self.plan, self.allocator, kv_lens, q)
    self.plan.stats.record_kv(*kv, real_tokens * (real_tokens == real_requests))


def _io_prepare_warmup_batch(self, q: int, s: int) -> None:
    """A step of shape ``(q, s)`` that reads and writes only the trash sectors."""
    self.reset()
    kernel = ([], 0) if self.plan.attention == "ragged" else None
    self._present = dict(ids=[], positions=[], token_seq=[], write=[], logits=[], bases=[], args=self.arg_defaults.expand(-1, s).clone())
    self._fill(q, s, **self._present, kernel=kernel)


def _io_refill_present(self) -> None:
    """This step's inputs again, for the present path (its write slots and block bases; ``wrap_fallback``)."""
    present = self._present
    q, s = self._kwargs["input_ids"].shape[1], present["args"].shape[1]
    self._fill(q, s, **present)


def _io_fill(self, q: int, s: int, *, ids, positions, token_seq, write, logits, bases, args, kernel=None) -> None:
    import torch

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
        self._kwargs.update(ragged.step_kwargs(self.plan.kernel_variant, self._kwargs.pop("tpu_block_base"), *parts[7:]))


def _io_get_model_kwargs(self, use_padding: bool = False) -> dict:
    return dict(self._kwargs) if self._kwargs is not None else {}


@functools.cache
def io_class() -> type:
    """``TPUBatchIO``: upstream's ``ContinuousBatchingIOs`` with the steps below (built on first use)."""
    from transformers.generation.continuous_batching.input_outputs import ContinuousBatchingIOs

    class TPUBatchIO(ContinuousBatchingIOs):
        """Inputs and outputs of a continuous-batching step on TPU, synchronous (no stream).

        Replaces ``ContinuousBatchingIOs`` when the manager runs on a TPU; it allocates no
        ``[max_batch_tokens, cache]`` attention mask (the mask is computed from positions in the step).
        """

        __init__ = _io_init
        reset = _io_reset
        retrieve_device_outputs = _io_retrieve_device_outputs
        prepare_batch_tensors = _io_prepare_batch_tensors
        prepare_warmup_batch = _io_prepare_warmup_batch
        _fill = _io_fill
        refill_present = _io_refill_present
        get_model_kwargs = _io_get_model_kwargs

    return TPUBatchIO
