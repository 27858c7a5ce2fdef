"""The battery of ``transformers-tpu selftest``: each check a claim, tested on the TPU against the CPU.

Every check builds its tiny models locally (``testing.tiny``: context-sensitive, so equal tokens
mean something), computes the CPU reference with plain Transformers (the plugin changes nothing off
TPU), runs the same code on the TPU, and returns the facts it measured or raises ``AssertionError``
with the difference (``selftest.Skip`` with the reason when it cannot run here). :data:`CHECKS` is
the battery; its list and what each proves are in ``docs/selftest.md``. The checks that start other
processes run before any check opens the chip in this process (a chip is held by one process,
torch_tpu #4166). Programs are counted as torch_tpu counts them (``torch.tpu._get_cache_misses``,
through ``testing.programs.no_new_programs``), so the same checks hold on a chip and on the simulator.
"""

from __future__ import annotations

import contextlib
import os
import time
from typing import Any, Iterator

from .selftest_battery import Check, Context, Skip
from .selftest_workers import compile_cache, ddp

__all__ = ["CHECKS", "FAMILIES", "TRAIN_TOLERANCE"]

#: Two decoder families: GQA with tied embeddings, and multi-head attention untied.
FAMILIES = ("qwen3", "llama")
#: Largest |loss difference| of the Trainer check, relative to the CPU loss: float32 on the simulated
#: TPU (the same math as the CPU), bf16 on a chip (torch_tpu runs float32 matmuls in bfloat16).
TRAIN_TOLERANCE = {"fp32": 1e-4, "bf16": 2e-2}
PROMPT, NEW = 11, 8


@contextlib.contextmanager
def _exact(ctx: Context) -> Iterator[None]:
    """float32 matmuls at full precision on a chip (its default is bf16), so greedy tokens can be compared
    with the CPU's; ``set_float32_matmul_precision`` is what torch_tpu maps to its precision setting."""
    import torch

    before = torch.get_float32_matmul_precision()
    if ctx.on_chip:
        torch.set_float32_matmul_precision("highest")
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(before)


def _ids(vocab: int, rows: int, length: int, seed: int) -> Any:
    import torch

    return torch.randint(2, vocab, (rows, length), generator=torch.Generator().manual_seed(seed))


def _differ(name: str, got: Any, want: Any) -> str:
    got, want = got.tolist(), want.tolist()
    for row, (g, w) in enumerate(zip(got, want)):
        if g != w:
            at = next(i for i, (a, b) in enumerate(zip(g, w)) if a != b) if len(g) == len(w) else "length"
            return f"{name}: row {row} differs from the CPU at position {at}: tpu {g} vs cpu {w}"
    return f"{name}: tpu {got} vs cpu {want}"


def _expect_equal(name: str, got: Any, want: Any) -> None:
    import torch

    got = got.cpu()
    if got.shape != want.shape or not torch.equal(got, want):
        raise AssertionError(_differ(name, got, want))


# ---------------------------------------------------------------------------------------------


def activation(ctx: Context) -> dict[str, Any]:
    import accelerate.utils.modeling  # noqa: F401 - the patches' targets imported: their patches are applied
    import transformers.generation.utils  # noqa: F401
    import transformers.modeling_utils  # noqa: F401

    from .. import activation as act

    before = act.active_patches()
    assert before, "no patch is active (is TRANSFORMERS_TPU_EXT_DISABLE set?)"
    generate = transformers.GenerationMixin.generate
    act.deactivate()
    try:
        assert act.active_patches() == [], f"deactivate() left patches active: {act.active_patches()}"
        restored = transformers.GenerationMixin.generate
        assert restored is not generate, "deactivate() left generate() wrapped"
    finally:
        act.activate()
    after = act.active_patches()
    assert after == before, f"activate() again applied {after}, not {before}"
    assert transformers.GenerationMixin.generate is not restored, "activate() again did not wrap generate()"
    return {"patches": len(before)}


def placement(ctx: Context) -> dict[str, Any]:
    import torch
    from accelerate.utils import get_max_memory
    from transformers import AutoModelForCausalLM

    path = ctx.model_dir("qwen3")
    model = AutoModelForCausalLM.from_pretrained(path, device_map="auto")
    devices = sorted({p.device.type for p in model.parameters()})
    assert devices == ["tpu"], f'device_map="auto" put parameters on {devices}, not only on tpu ({getattr(model, "hf_device_map", None)})'
    hbm = torch.tpu.get_device_properties().total_memory
    budget = get_max_memory().get("tpu")
    assert budget is not None and 0 < budget <= hbm, f"Accelerate's placement budget for the TPU is {budget}, HBM is {hbm}"
    tied = model.lm_head.weight is model.model.embed_tokens.weight
    assert tied, "tied input/output embeddings were untied on the way to the TPU"
    cpu = AutoModelForCausalLM.from_pretrained(path)
    ids = _ids(cpu.config.vocab_size, 1, PROMPT, 0)
    with _exact(ctx), torch.no_grad():
        got, want = model(ids.to("tpu")).logits.cpu(), cpu(ids).logits
    diff = float((got - want).abs().max())
    assert diff < 1e-3, f"logits differ from the CPU by {diff:.3g}"
    return {"hbm_bytes": hbm, "budget_bytes": budget, "device_map": dict(getattr(model, "hf_device_map", None) or {"": "tpu"}), "max_logit_diff": diff}


def _generation(ctx: Context, arch: str) -> dict[str, Any]:
    import torch

    from .. import warmup
    from ..testing.programs import no_new_programs
    from ..testing.tiny import check_context_sensitive, tiny_model

    model, draft = tiny_model(arch, seed=0), tiny_model(arch, seed=1)
    check_context_sensitive(model)
    ids, other = _ids(model.config.vocab_size, 2, PROMPT, 1), _ids(model.config.vocab_size, 1, PROMPT - 4, 2)
    # Greedy on 2 rows (row padding), the other modes on 1 (assisted decoding takes one row). Assisted
    # decoding and prompt lookup run upstream's loop (eager, slow on the simulator): the first family only.
    modes = {
        "greedy": (ids, dict(do_sample=False)),
        "beam": (ids[:1], dict(do_sample=False, num_beams=2)),
    }
    if arch == FAMILIES[0]:
        modes["prompt_lookup"] = (ids[1:], dict(do_sample=False, prompt_lookup_num_tokens=3))
        modes["assisted"] = (ids[:1], dict(do_sample=False, assistant_model=draft))
    ref = {name: model.generate(rows, max_new_tokens=NEW, min_new_tokens=NEW, **kw) for name, (rows, kw) in modes.items()}
    ref["other"] = model.generate(other, max_new_tokens=NEW, do_sample=False)
    model.to("tpu")
    draft.to("tpu")
    facts: dict[str, Any] = {}
    with _exact(ctx):
        for name, (rows, kw) in modes.items():
            before = ctx.programs()
            _expect_equal(name, model.generate(rows.to("tpu"), max_new_tokens=NEW, min_new_tokens=NEW, **kw), ref[name])
            facts[f"{name}_programs"] = ctx.programs() - before
        samples = []
        for _ in range(2):
            torch.manual_seed(7)
            samples.append(model.generate(ids[:1].to("tpu"), max_new_tokens=NEW, do_sample=True, top_k=20).cpu())
        assert torch.equal(*samples), f"seeded sampling is not reproducible: {samples[0].tolist()} vs {samples[1].tolist()}"
        before = ctx.programs()
        # The call after it: one row, a prompt shorter than PROMPT (more rows or longer prompts would only
        # add buckets to compile: prompts up to 16 tokens, padding included, are one bucket).
        warmup(model, max_prompt_length=PROMPT, max_new_tokens=NEW, max_batch_size=1)
        facts["warmup_programs"] = ctx.programs() - before
        with no_new_programs(f"{arch}: greedy generate() of a new prompt length after warmup()"):
            got = model.generate(other.to("tpu"), max_new_tokens=NEW, do_sample=False)
        _expect_equal("after warm-up", got, ref["other"])
    facts["steady_state_programs"] = 0
    return facts


def generate_qwen3(ctx: Context) -> dict[str, Any]:
    return _generation(ctx, "qwen3")


def generate_llama(ctx: Context) -> dict[str, Any]:
    return _generation(ctx, "llama")


def decode_bytes(ctx: Context) -> dict[str, Any]:
    if ctx.traffic() is None:
        raise Skip("torch_tpu counts no host<->device bytes; the simulated TPU does (run it without a chip)")
    from ..testing.tiny import tiny_model

    model = tiny_model("qwen3", seed=0).to("tpu")
    ids = _ids(model.config.vocab_size, 1, PROMPT, 3).to("tpu")  # one row: the programs generate_qwen3 made
    per_call = {}
    for new in (4, 4, 12):  # the first call warms up; the last two differ by 8 decode steps
        before = ctx.traffic()
        model.generate(ids, max_new_tokens=new, min_new_tokens=new, do_sample=False)
        per_call[new] = ctx.traffic() - before
    per_step_row = (per_call[12] - per_call[4]) / 8 / ids.shape[0]
    logits_row = model.config.vocab_size * 4
    assert per_step_row <= 64, f"{per_step_row:.0f} bytes cross per decode step and row (the logits of a row are {logits_row})"
    return {"bytes_per_step_and_row": per_step_row, "logits_bytes_per_row": logits_row}


def continuous_batching(ctx: Context) -> dict[str, Any]:
    import torch
    from transformers import GenerationConfig

    from ..serving import policy
    from ..testing.tiny import tiny_model

    model = tiny_model("qwen3", seed=0)
    gen = torch.Generator().manual_seed(4)
    prompts = [torch.randint(2, model.config.vocab_size, (n,), generator=gen).tolist() for n in (3, 17, 9, 30)]
    ref = [model.generate(torch.tensor([p]), max_new_tokens=5, min_new_tokens=5, do_sample=False)[0, len(p):].tolist() for p in prompts]
    model.to("tpu")
    config = GenerationConfig(do_sample=False, eos_token_id=1, pad_token_id=0)
    policy.configure(max_batch_tokens=32, max_requests=8)  # two step shapes to precompile: a short check
    try:
        with _exact(ctx):
            out = model.generate_batch(prompts, generation_config=config, max_new_tokens=5)
    finally:
        policy.reset()
    got = [o.generated_tokens for o in out.values()]
    assert got == ref, f"generate_batch gave {got}, per-request generate() on the CPU {ref}"
    return {"requests": len(prompts)}


def trainer(ctx: Context) -> dict[str, Any]:
    from accelerate.state import AcceleratorState, GradientState
    from transformers import DataCollatorForLanguageModeling, PrinterCallback, Trainer, TrainingArguments

    from ..testing.tiny import tiny_lm_dataset, tiny_model, tiny_tokenizer

    tokenizer = tiny_tokenizer()
    tokenizer.padding_side = "right"
    data = tiny_lm_dataset(num_examples=24, max_length=40)

    def losses(use_cpu: bool) -> list[float]:
        AcceleratorState._reset_state(reset_partial_state=True)
        GradientState._reset_state()
        args = TrainingArguments(
            output_dir=os.path.join(ctx.tmp, "trainer"), per_device_train_batch_size=4, max_steps=6, logging_steps=1,
            report_to=[], learning_rate=1e-3, save_strategy="no", seed=0, disable_tqdm=True, use_cpu=use_cpu,
        )
        run = Trainer(model=tiny_model("qwen3", seed=0), args=args, train_dataset=data,
                      data_collator=DataCollatorForLanguageModeling(tokenizer, mlm=False))
        run.remove_callback(PrinterCallback)  # the report says what the losses were, not the console
        run.train()
        device = next(run.model.parameters()).device.type
        assert device == ("cpu" if use_cpu else "tpu"), f"the Trainer trained on {device}"
        return [entry["loss"] for entry in run.state.log_history if "loss" in entry]

    cpu, tpu = losses(True), losses(False)
    precision = "fp32" if ctx.simulated else "bf16"
    tolerance = TRAIN_TOLERANCE[precision]
    worst = max(abs(a - b) / max(abs(b), 1e-6) for a, b in zip(tpu, cpu))
    assert len(cpu) == len(tpu) and worst <= tolerance, (
        f"losses differ from the CPU by {worst:.3g} (relative; {precision} tolerance {tolerance}): tpu {tpu} vs cpu {cpu}"
    )
    return {"steps": len(tpu), "max_relative_diff": worst, "tolerance": tolerance, "precision": precision}


def int8_weights(ctx: Context) -> dict[str, Any]:
    try:
        from torchao.quantization import Int8WeightOnlyConfig
    except ImportError:
        raise Skip("torchao is not installed (pip install torchao)") from None
    from transformers import AutoModelForCausalLM, TorchAoConfig

    path = ctx.model_dir("qwen3")
    int8 = lambda: TorchAoConfig(Int8WeightOnlyConfig())  # noqa: E731 - one config object per load
    cpu = AutoModelForCausalLM.from_pretrained(path, quantization_config=int8())
    ids = _ids(cpu.config.vocab_size, 2, PROMPT, 5)
    want = cpu.generate(ids, max_new_tokens=NEW, min_new_tokens=NEW, do_sample=False)
    model = AutoModelForCausalLM.from_pretrained(path, device_map="auto", quantization_config=int8())
    weight = model.model.layers[0].mlp.up_proj.weight
    assert weight.device.type == "tpu", f"int8 weights are on {weight.device}"
    with _exact(ctx):
        _expect_equal("int8 weights", model.generate(ids.to("tpu"), max_new_tokens=NEW, min_new_tokens=NEW, do_sample=False), want)
    return {"weight": type(weight).__name__}


def int8_kv_cache(ctx: Context) -> dict[str, Any]:
    import torch
    from transformers import StaticCache
    from transformers.cache_utils import StaticLayer

    from ..generation import config as generation_config
    from ..testing.tiny import tiny_model

    def fake_quant(states: Any) -> Any:  # what the int8 layer's attention reads: absmax/127 per position and head
        scale = states.float().abs().amax(-1, keepdim=True).clamp(min=1e-8) / 127
        return (torch.round(states.float() / scale).clamp(-127, 127).to(torch.int8).float() * scale).to(states.dtype)

    class FakeQuantLayer(StaticLayer):
        def update(self, key_states: Any, value_states: Any, *args: Any, **kwargs: Any) -> Any:
            return super().update(fake_quant(key_states), fake_quant(value_states), *args, **kwargs)

    model = tiny_model("qwen3", seed=0, head_dim=64)
    ids = _ids(model.config.vocab_size, 2, PROMPT, 3)
    cache = StaticCache(config=model.config, max_cache_len=64)
    cache.layers = [FakeQuantLayer(max_cache_len=64) for _ in cache.layers]
    want = model.generate(ids, max_new_tokens=NEW, min_new_tokens=NEW, do_sample=False, cache=cache)
    model.to("tpu")
    before = generation_config.current()
    generation_config.configure(kv_cache="int8")
    try:
        with _exact(ctx):
            got = model.generate(ids.to("tpu"), max_new_tokens=NEW, min_new_tokens=NEW, do_sample=False)
    finally:
        generation_config.configure(kv_cache=before.kv_cache)
    _expect_equal("int8 KV cache", got, want)
    return {}


def decode_timing(ctx: Context) -> dict[str, Any]:
    if ctx.simulated:
        raise Skip("timings on the simulated TPU are not meaningful")
    from ..generation import config as generation_config
    from ..testing.tiny import tiny_model

    model = tiny_model("qwen3", seed=0).to("tpu")
    ids = _ids(model.config.vocab_size, 1, PROMPT, 6).to("tpu")
    before = generation_config.current()
    per_token = {}
    try:
        for loop, on_device in (("host", False), ("device", True)):
            generation_config.configure(device_decode=on_device)
            seconds = {}
            for new in (16, 16, 64, 16, 64):  # warm both lengths, keep the last of each
                start = time.perf_counter()
                model.generate(ids, max_new_tokens=new, min_new_tokens=new, do_sample=False).cpu()
                seconds[new] = time.perf_counter() - start
            per_token[loop] = (seconds[64] - seconds[16]) / 48 * 1000
    finally:
        generation_config.configure(device_decode=before.device_decode)
    ctx.timings["host_loop_ms_per_token"] = round(per_token["host"], 4)
    ctx.timings["device_loop_ms_per_token"] = round(per_token["device"], 4)
    return dict(ctx.timings)


CHECKS: tuple[Check, ...] = (
    Check("activation", "deactivate() removes every patch and restores the originals; activate() applies the same set again", activation),
    Check("compile_cache", "a second process with the same persistent compile cache compiles 0 programs", compile_cache),
    Check("ddp", "DDP over tpu_dist on 2+ chips: replicas stay equal after training steps", ddp),
    Check("placement", 'from_pretrained(device_map="auto") puts every weight on the TPU within its HBM budget, ties kept, logits equal to the CPU', placement),
    Check("generate_qwen3", "generate() on GQA/tied Qwen3: greedy, beam, prompt lookup, assisted (draft model) equal the CPU; seeded sampling reproducible; 0 programs after warmup()", generate_qwen3),
    Check("decode_bytes", "the device decode loop moves token ids, not logits, per step (bytes counted)", decode_bytes),
    Check("generate_llama", "the same on multi-head, untied Llama (greedy, beam, sampling, steady state)", generate_llama),
    Check("continuous_batching", "generate_batch() equals per-request generate() on the CPU", continuous_batching),
    Check("trainer", "a plain Trainer run trains on the TPU with losses equal to a CPU run within the stated tolerance", trainer),
    Check("int8_weights", "torchao int8 weight-only weights stay int8 on the TPU; tokens equal the same model on the CPU", int8_weights),
    Check("int8_kv_cache", "the opt-in int8 KV cache gives the tokens of the same quantization on the CPU", int8_kv_cache),
    Check("decode_timing", "(chip only) host decode loop vs device loop, ms per token", decode_timing),
)
