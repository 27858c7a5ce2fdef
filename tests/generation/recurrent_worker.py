"""Worker of test_recurrent_generate.py: state-space and hybrid families on the simulated TPU (one JSON value).

Per family (``ARCHS``): 12 mixed greedy calls (batches of 1-3, prompts of 1-100 tokens: chunked prefills
among them, ragged left-padded batches too, inputs on the TPU) against plain CPU Transformers; then ``warmup()``
for prompts of up to 40 tokens in batches of up to 2 (the issue's workload; every bucket of 100 tokens and 3 rows
made this file a third of the suite's time) and 6 more such calls in torch_tpu's cache-only mode; one seeded
sampling call and one beam search; 4 prompts of 17-20 tokens with the plugin's padding columns unmasked
(``wrap_generate._BREAK_PADDING_MASK``). ``BIAS=1`` adds the family's bias variant (its input projection's bias
drawn at random): the CPU's tokens on the predicate's path, its prompt unpadded (``test_recurrent_premises.py``
shows such a bias reaching the real tokens through left padding). ``llama`` in ``ARCHS``: the 12 mixed calls
only, an attention model's programs on the same calls.
"""
from _worker import report
import logging, os, random, time, torch
import transformers_tpu_ext
from transformers_tpu_ext import testing
from transformers_tpu_ext.generation import recurrent, wrap_generate
from transformers_tpu_ext.testing import programs
from transformers_tpu_ext.testing.tiny import check_context_sensitive, tiny_model

sim = testing.install(chips=1)
records = []
handler = logging.Handler()
handler.emit = lambda record: records.append(record.getMessage())
logger = logging.getLogger("transformers_tpu_ext")
logger.addHandler(handler)
logger.setLevel(logging.DEBUG)
#: The padding id of the ragged batches and of the plugin's padding columns: one whose embedding is not zero
#: (the tiny hybrids' embeddings zero id 0, their padding_idx, which would hide unmasked padding).
PAD = 5
#: The longest prompt of the calls after ``warmup()`` (the buckets it compiles for them).
WARM_PROMPT = 40


def workload(vocab, calls, seed, longest, batches=(1, 1, 2, 3)):
    rng, gen = random.Random(seed), torch.Generator().manual_seed(seed)
    out = []
    for index in range(calls):
        batch, length, new = rng.choice(batches), rng.randint(1, longest), rng.randint(1, 8)
        ids = torch.randint(2, vocab, (batch, length), generator=gen)
        mask = torch.ones_like(ids)
        if index % 2 and batch > 1 and length > 2:  # a ragged batch, left-padded as a tokenizer pads it
            mask[1:, : rng.randint(1, length - 1)] = 0
            ids[mask == 0] = PAD
        out.append((ids, mask, new))
    return out


def run(model, calls, device, **kw):
    outs, counts = [], []
    for ids, mask, new in calls:
        before = sim.counters()
        out = model.generate(ids.to(device), attention_mask=mask.to(device), max_new_tokens=new, do_sample=False, **kw)
        counts.append((sim.counters() - before).programs)
        outs.append(out.cpu())
    return outs, counts


def same(a, b):
    return [bool(torch.equal(x, y)) for x, y in zip(a, b)]


r = {}
for arch in os.environ["ARCHS"].split(","):
    res = r[arch] = {}
    try:
        model = tiny_model(arch, seed=0)
        model.generation_config.pad_token_id = PAD
        check_context_sensitive(model)
        vocab = model.config.vocab_size
        calls, later = workload(vocab, 12, 1, 100), workload(vocab, 6, 2, WARM_PROMPT, (1, 2))
        refs, _ = run(model, calls, "cpu")
        if arch == "llama":  # the baseline: an attention model's programs on the same calls
            model.to("tpu")
            outs, res["programs"] = run(model, calls, "tpu")
            res["match"] = same(outs, refs)
            torch._dynamo.reset()
            continue
        later_refs, _ = run(model, later, "cpu")
        ids, mask, _ = calls[3]
        torch.manual_seed(3)
        sample_ref = model.generate(ids, attention_mask=mask, max_new_tokens=6, do_sample=True, top_k=20)
        beam_ref = model.generate(ids, attention_mask=mask, max_new_tokens=6, num_beams=2, do_sample=False)
        model.to("tpu")
        started = time.perf_counter()
        del records[:]
        outs, counts = run(model, calls, "tpu")
        res["match"] = same(outs, refs)
        res["programs"] = counts
        res["wall_s"] = {"mixed": round(time.perf_counter() - started)}
        res["decisions"] = sorted({m for m in records if "generate() handled" in m or "left to upstream" in m
                                   or "decoding loop" in m})
        torch.manual_seed(3)
        sampled = model.generate(ids.to("tpu"), attention_mask=mask.to("tpu"), max_new_tokens=6, do_sample=True, top_k=20)
        res["sample_match"] = bool(torch.equal(sampled.cpu(), sample_ref))
        beam = model.generate(ids.to("tpu"), attention_mask=mask.to("tpu"), max_new_tokens=6, num_beams=2, do_sample=False)
        res["beam_match"] = bool(torch.equal(beam.cpu(), beam_ref))
        started = time.perf_counter()
        transformers_tpu_ext.warmup(model, max_prompt_length=WARM_PROMPT, max_new_tokens=8, max_batch_size=2)
        try:
            with programs.cache_only("calls after warmup()"):
                outs, _ = run(model, later, "tpu")
            res["cache_only"] = "ok"
            res["cache_only_match"] = same(outs, later_refs)
        except Exception as error:  # noqa: BLE001
            res["cache_only"] = f"{type(error).__name__}: {error}"[:300]
        res["wall_s"]["warmup_cache_only"] = round(time.perf_counter() - started)
        # Prompts of 17-20 tokens: 12-15 padding columns each (their bucket is 32), then unmasked.
        gen = torch.Generator().manual_seed(4)
        padded = [(torch.randint(2, vocab, (1, 17 + i), generator=gen), None, 8) for i in range(4)]
        padded = [(ids, torch.ones_like(ids), new) for ids, _, new in padded]
        model.to("cpu")
        padded_refs, _ = run(model, padded, "cpu")
        model.to("tpu")
        wrap_generate._BREAK_PADDING_MASK = True
        try:
            broken, _ = run(model, padded, "tpu")
        finally:
            wrap_generate._BREAK_PADDING_MASK = False
        res["broken_match"] = same(broken, padded_refs)
        family = recurrent.FAMILIES[model.config.model_type]
        if os.environ.get("BIAS") == "1" and family.bias is not None:
            biased = tiny_model(arch, seed=0, **{family.bias: True})
            biased.generation_config.pad_token_id = PAD
            torch.manual_seed(7)  # Transformers initialises biases to zero, which padding could not reveal
            with torch.no_grad():
                for module in biased.modules():
                    if type(module).__name__ == family.mixer:
                        module.in_proj.bias.normal_(0, 1.0)
            check_context_sensitive(biased)
            refs, _ = run(biased, calls[:6], "cpu")
            biased.to("tpu")
            outs, _ = run(biased, calls[:6], "tpu")
            res["bias_match"] = same(outs, refs)
    except Exception as error:  # noqa: BLE001
        import traceback

        res["error"] = traceback.format_exc()[-1500:]
    torch._dynamo.reset()
report(r)
