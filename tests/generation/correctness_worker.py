"""Worker of test_generation_correctness.py: runs in a fresh interpreter (tests/_subprocess.run_python) and reports one JSON value."""
from _worker import report
import torch
import transformers_tpu_ext as ext
from transformers import LogitsProcessor, LogitsProcessorList, StoppingCriteria, StoppingCriteriaList
from transformers_tpu_ext import testing
from transformers_tpu_ext.testing.tiny import check_context_sensitive, tiny_model, tiny_tokenizer
from transformers_tpu_ext.generation.call import cache_key  # "cache" (Transformers 5.24+) or "past_key_values" (5.23)

sim = testing.install(chips=4)
model = tiny_model("qwen3", seed=0)
check_context_sensitive(model)
V = model.config.vocab_size
gen = torch.Generator().manual_seed(0)
ids = torch.randint(2, V, (3, 10), generator=gen)
r = {}

def section(*names):
    # Run one scenario; an exception is what the user would see, reported under its names.
    def run(body):
        try:
            body()
        except Exception as error:
            for name in names:
                r.setdefault(name, {"error": f"{type(error).__name__}: {error}"[:300]})
        finally:
            model.to("cpu")
    return run

# 1. Callbacks see the caller's rows and lengths (batch of 3, 10-token prompts).
class AfterNew(StoppingCriteria):
    def __init__(self, start, new):
        self.start, self.new, self.shapes = start, new, []
    def __call__(self, input_ids, scores, **kw):
        self.shapes.append(list(input_ids.shape))
        return torch.full((input_ids.shape[0],), input_ids.shape[1] - self.start >= self.new, dtype=torch.bool)

class RowBias(LogitsProcessor):  # a per-row bias: [3, vocab]
    def __init__(self):
        self.bias = torch.zeros(3, V)
        for row, token in enumerate((7, 8, 9)):
            self.bias[row, token] = 5.0
    def __call__(self, input_ids, scores):
        return scores + self.bias.to(scores.device)

calls = []
def allowed(batch_id, sent):
    calls.append([batch_id, len(sent)])
    return [7, 8, 9, 10 + batch_id]

def callbacks(device):
    model.to(device)
    criteria = AfterNew(10, 5)
    out = {}
    try:
        out["stop"] = model.generate(ids.to(device), max_new_tokens=20, do_sample=False,
                                     stopping_criteria=StoppingCriteriaList([criteria])).cpu().tolist()
        out["criteria_shapes"] = criteria.shapes
        out["bias"] = model.generate(ids.to(device), max_new_tokens=6, do_sample=False,
                                     logits_processor=LogitsProcessorList([RowBias()])).cpu().tolist()
        calls.clear()
        out["prefix"] = model.generate(ids.to(device), max_new_tokens=3, do_sample=False,
                                       prefix_allowed_tokens_fn=allowed).cpu().tolist()
        out["prefix_calls"] = sorted(set(map(tuple, calls)))
    except Exception as error:
        out["error"] = f"{type(error).__name__}: {error}"[:300]
    return out

cpu_callbacks = callbacks("cpu")
tpu_callbacks = callbacks("tpu")
r["callbacks"] = dict(cpu=cpu_callbacks, tpu=tpu_callbacks)

# Error messages name the caller's lengths.
model.to("tpu")
try:
    model.generate(torch.randint(2, V, (1, 26), generator=gen).to("tpu"), max_length=20)
    r["length_error"] = None
except ValueError as error:
    r["length_error"] = str(error)

# 2. Seeded sampling draws what the unpatched call draws on the same device (batch 1, 3, 4).
@section("sampling_same_stream", "sampling_differs_from_another_seed")
def _():
  model.to("tpu")
  def sampled(rows):
    torch.manual_seed(5)
    return model.generate(ids[:rows].to("tpu"), max_new_tokens=8, do_sample=True, top_k=30, temperature=0.9).cpu()
  patched = [sampled(rows) for rows in (1, 3, 4)]
  ext.deactivate()
  try:
      unpatched = [sampled(rows) for rows in (1, 3, 4)]
  finally:
      ext.activate()
  r["sampling_same_stream"] = [torch.equal(a, b) for a, b in zip(patched, unpatched)]
  torch.manual_seed(6)
  other = model.generate(ids[:3].to("tpu"), max_new_tokens=8, do_sample=True, top_k=30, temperature=0.9).cpu()
  r["sampling_differs_from_another_seed"] = not torch.equal(patched[1], other)

# 3. An invalid pad id (-1, or out of range) never reaches the embedding.
outs = {}
for pad in (-1, V + 5):
    fresh = tiny_model("qwen3", seed=0)
    fresh.generation_config.pad_token_id = pad
    reference = fresh.generate(ids[:1], max_new_tokens=4, do_sample=False)
    fresh.to("tpu")
    try:
        outs[str(pad)] = torch.equal(fresh.generate(ids[:1].to("tpu"), max_new_tokens=4, do_sample=False).cpu(), reference)
    except Exception as error:
        outs[str(pad)] = f"{type(error).__name__}: {error}"[:200]
r["invalid_pad"] = outs

# 4. Caches the caller sees are the ones upstream returns (a fresh model each).
@section("cache_static", "cache_default")
def _():
 def cache_of(device, **kw):
    fresh = tiny_model("qwen3", seed=0).to(device)
    mask = torch.ones_like(ids); mask[1, :4] = 0
    out = fresh.generate(ids.to(device), attention_mask=mask.to(device), max_new_tokens=6, do_sample=False,
                         return_dict_in_generate=True, **kw)
    cache = getattr(out, cache_key())
    layer = cache.layers[0]
    return dict(type=type(cache).__name__, length=int(cache.get_seq_length()),
                max_cache_len=getattr(layer, "max_cache_len", None), rows=int(layer.keys.shape[0]),
                keys=layer.keys[:, :, :int(cache.get_seq_length())].cpu(), sequences=out.sequences.cpu())
 for name, kw in (("static", dict(cache_implementation="static")), ("default", {})):
    a, b = cache_of("cpu", **kw), cache_of("tpu", **kw)
    same_keys = a["keys"].shape == b["keys"].shape and bool(torch.allclose(a["keys"], b["keys"], atol=1e-5))
    r[f"cache_{name}"] = dict(
        cpu={k: v for k, v in a.items() if k not in ("keys", "sequences")},
        tpu={k: v for k, v in b.items() if k not in ("keys", "sequences")},
        keys_close=same_keys,
        sequences_equal=torch.equal(a["sequences"], b["sequences"]),
    )

# 4b. Found by Transformers' own tests: attentions returned keep upstream's shapes; the cache after
# inputs_embeds holds the prompt; an invalid pad id reaches no dummy row of a padded batch.
@section("attentions")
def _():
    eager = tiny_model("qwen3", seed=0)
    eager.set_attn_implementation("eager")  # SDPA returns no attention weights
    def shapes(device):
        eager.to(device)
        out = eager.generate(ids[:2].to(device), max_new_tokens=3, do_sample=False, return_dict_in_generate=True,
                             output_attentions=True, output_hidden_states=True)
        return dict(attentions=[list(step[0].shape) for step in out.attentions],
                    hidden=[list(step[0].shape) for step in out.hidden_states], sequences=out.sequences.cpu().tolist())
    r["attentions"] = dict(cpu=shapes("cpu"), tpu=shapes("tpu"))

@section("embeds_cache")
def _():
    embeds = model.get_input_embeddings()(ids[:2]).detach()
    def cache(device):
        model.to(device)
        out = model.generate(inputs_embeds=embeds.to(device), max_new_tokens=3, do_sample=False,
                             return_dict_in_generate=True)
        return getattr(out, cache_key()).layers[0].keys.cpu(), type(getattr(out, cache_key())).__name__
    (a, kind_a), (b, kind_b) = cache("cpu"), cache("tpu")
    r["embeds_cache"] = dict(cpu=[list(a.shape), kind_a], tpu=[list(b.shape), kind_b],
                             close=a.shape == b.shape and bool(torch.allclose(a, b, atol=1e-5)))

@section("pad_never_generated")
def _():
    # pad = eos = -1: no row ever finishes, so upstream never embeds -1; batches of 3 and 13 are padded.
    r["pad_never_generated"] = {}
    for rows in (3, 13):
        x = torch.randint(2, V, (rows, 7), generator=gen)
        for name, kw in (("device_loop", {}), ("host_loop", dict(return_dict_in_generate=True, output_scores=True))):
            model.to("cpu")
            ref = model.generate(x, max_new_tokens=4, do_sample=False, pad_token_id=-1, eos_token_id=-1, **kw)
            model.to("tpu")
            try:
                out = model.generate(x.to("tpu"), max_new_tokens=4, do_sample=False, pad_token_id=-1, eos_token_id=-1, **kw)
                seqs = lambda o: (o.sequences if kw else o).cpu()
                r["pad_never_generated"][f"{name}/{rows}"] = torch.equal(seqs(out), seqs(ref))
            except Exception as error:
                r["pad_never_generated"][f"{name}/{rows}"] = f"{type(error).__name__}: {error}"[:200]

# 5. Assisted decoding and prompt lookup, inputs on the TPU (left to upstream, never a crash).
model.to("cpu")
assistant = tiny_model("qwen3", seed=1)
single = ids[:1]
refs = dict(lookup=model.generate(single, max_new_tokens=8, do_sample=False, prompt_lookup_num_tokens=3),
            assisted=model.generate(single, max_new_tokens=8, do_sample=False, assistant_model=assistant))
model.to("tpu"); assistant.to("tpu")
for name, kw in (("lookup", dict(prompt_lookup_num_tokens=3)), ("assisted", dict(assistant_model=assistant))):
    try:
        out = model.generate(single.to("tpu"), max_new_tokens=8, do_sample=False, **kw)
        r[name] = dict(device=str(out.device), match=torch.equal(out.cpu(), refs[name]))
    except Exception as error:
        r[name] = dict(error=f"{type(error).__name__}: {error}"[:300])

# 6. Bytes per row and decode step in steady state: the difference between 8 and 24 new tokens.
model.to("tpu")
def per_row_step(batch, where, **kw):
    x = torch.randint(2, V, (batch, 10), generator=gen).to(where)
    counts = {}
    for n in (8, 24):
        model.generate(x, max_new_tokens=n, min_new_tokens=n, **kw)
        before = sim.counters()
        model.generate(x, max_new_tokens=n, min_new_tokens=n, **kw)
        counts[n] = sim.counters() - before
    d = counts[24] - counts[8]
    return dict(d2h=d.d2h_bytes / 16 / batch, h2d=d.h2d_bytes / 16 / batch, programs=d.programs)
device_kw = dict(greedy=dict(do_sample=False), sample=dict(do_sample=True, top_k=40, top_p=0.9, min_p=0.01, temperature=0.7))
host_kw = dict(repetition_penalty=dict(do_sample=False, repetition_penalty=1.3),
               output_scores=dict(do_sample=False, return_dict_in_generate=True, output_scores=True))
r["bytes"] = {f"{name}/b{batch}/{where}": per_row_step(batch, where, **kw)
              for name, kw in {**device_kw, **host_kw}.items() for batch in (1, 8) for where in ("cpu", "tpu")
              if name in device_kw or (batch == 1 and where == "tpu")}

# 7. The host loop keeps every option working, tokens equal to CPU.
@section("options", "scores")
def _():
 model.to("cpu")
 mask = torch.ones_like(ids); mask[2, :5] = 0
 tokenizer = tiny_tokenizer()
 stop_word = tokenizer.decode(model.generate(ids[:1], max_new_tokens=4, do_sample=False)[0, 12:14])
 options = dict(
     repetition_penalty=dict(repetition_penalty=1.3),
     no_repeat_ngram=dict(no_repeat_ngram_size=2),
     bad_words=dict(bad_words_ids=[[7], [8, 9]]),
     min_new_tokens=dict(min_new_tokens=5, eos_token_id=[1, 11, 12]),
     stop_strings=dict(stop_strings=[stop_word], tokenizer=tokenizer),
 )
 refs = {name: model.generate(ids, attention_mask=mask, max_new_tokens=8, do_sample=False, **kw) for name, kw in options.items()}
 scores_ref = model.generate(ids, attention_mask=mask, max_new_tokens=4, do_sample=False, return_dict_in_generate=True,
                             output_scores=True, output_logits=True)
 model.to("tpu")
 r["options"] = {}
 for name, kw in options.items():
     try:
         out = model.generate(ids.to("tpu"), attention_mask=mask.to("tpu"), max_new_tokens=8, do_sample=False, **kw)
         r["options"][name] = torch.equal(out.cpu(), refs[name])
     except Exception as error:
         r["options"][name] = f"{type(error).__name__}: {error}"[:200]
 out = model.generate(ids.to("tpu"), attention_mask=mask.to("tpu"), max_new_tokens=4, do_sample=False,
                      return_dict_in_generate=True, output_scores=True, output_logits=True)
 r["scores"] = dict(
     rows=[list(s.shape) for s in out.scores], device=str(out.scores[0].device),
     close=all(torch.allclose(a.cpu(), b, atol=1e-4) for a, b in zip(out.scores, scores_ref.scores)),
     logits_close=all(torch.allclose(a.cpu(), b, atol=1e-4) for a, b in zip(out.logits, scores_ref.logits)),
     sequences=torch.equal(out.sequences.cpu(), scores_ref.sequences),
 )
report(r)
