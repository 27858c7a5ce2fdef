"""Worker of test_serve_routes.py: runs in a fresh interpreter (tests/_subprocess.run_python) and reports one JSON value."""
from _worker import report
import tempfile
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig, pipeline
from transformers.decision import DecisionConfig
from transformers_tpu_ext import testing
from transformers_tpu_ext.testing.tiny import check_context_sensitive, save_tiny_model

sim = testing.install(chips=1, hbm_bytes="128MiB")
path = save_tiny_model(tempfile.mkdtemp() + "/tiny", "qwen3")
tokenizer = AutoTokenizer.from_pretrained(path)
tokenizer.chat_template = (
    "{% for m in messages %}<|{{ m.role }}|>{{ m.content if m.content is string else m.content[0].text }}\n"
    "{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
tokenizer.save_pretrained(path)
DecisionConfig(labels={"noul": ["Y", "N"]}).save_pretrained(path)  # single tokens of the tiny tokenizer
cpu = AutoModelForCausalLM.from_pretrained(path)
check_context_sensitive(cpu)
r = {}

# The CPU's answers (the plugin changes nothing off TPU).
def generated(ids):
    ids = torch.tensor([ids])
    return tokenizer.decode(cpu.generate(ids, max_new_tokens=6, do_sample=False)[0, ids.shape[1]:], skip_special_tokens=True)

prompt = "The secret to baking a good cake is"
messages = [{"role": "user", "content": "Static shapes avoid recompilation"}]
question = {"state": "I was charged twice for my order and want a refund.",
            "questions": {"refund": {"type": "noul", "instructions": "Is a refund requested?"}}}
chat_ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=True)["input_ids"]
expected = {
    "completions": generated(tokenizer(prompt).input_ids),
    "chat": generated(chat_ids),
    "systemone": pipeline("decision", model=cpu, tokenizer=tokenizer, device="cpu")(question)["refund"]["noul"],
}

# transformers serve --continuous-batching, on the TPU host, as a user runs it (a process of its own; Transformers
# 5.25 runs the model in a spawned one, where the plugin's simulated TPU reports what it compiled).
from _serve_cli import Served

def call(method, route, body=None):
    return server.call(method, route, body, timeout=300)

ROUTES = {
    "GET /health": lambda: call("GET", "/health"),
    "GET /v1/models": lambda: call("GET", "/v1/models"),
    "POST /v1/systemone": lambda: call("POST", "/v1/systemone", question),
    "POST /v1/completions": lambda: call("POST", "/v1/completions", {"prompt": prompt, "max_tokens": 6, "temperature": 0}),
    "POST /v1/chat/completions": lambda: call("POST", "/v1/chat/completions",
                                              {"messages": messages, "max_tokens": 6, "temperature": 0}),
    "POST /v1/responses": lambda: call("POST", "/v1/responses",
                                       {"input": messages[0]["content"], "max_output_tokens": 6, "temperature": 0, "stream": False}),
}

def answer(route, status, payload):
    if status != 200:
        return status, payload
    if route.endswith("systemone"):
        return status, round(payload["answers"]["refund"]["noul"], 4)
    if route.endswith("/v1/completions"):
        return status, payload["choices"][0]["text"]
    if route.endswith("chat/completions"):
        return status, payload["choices"][0]["message"]["content"]
    if route.endswith("responses"):
        return status, payload["output"][0]["content"][0]["text"]
    return status, None

with Served(str(path)) as server:
    # Before any continuous-batching request (no manager yet), then every route in turn (the first
    # text route starts the manager), then every route again with the manager alive.
    r["before"] = {route: answer(route, *ROUTES[route]()) for route in ("GET /health", "GET /v1/models", "POST /v1/systemone")}
    r["first"] = {route: answer(route, *run()) for route, run in ROUTES.items()}
    programs = server.programs()
    r["again"] = {route: answer(route, *run()) for route, run in ROUTES.items()}
    engine = server.engine()
    r["engine"] = dict(patch=engine["patches"].get("continuous_batching"), again_programs=engine["counters"]["programs"] - programs)
r["expected"] = {key: (round(value, 4) if isinstance(value, float) else value) for key, value in expected.items()}

# A running manager's pause(): the calling thread uses the model (Transformers' documented purpose).
model = AutoModelForCausalLM.from_pretrained(path).to("tpu")
manager = model.init_continuous_batching(generation_config=GenerationConfig(do_sample=False, eos_token_id=1, pad_token_id=0))
manager.start()
ids = torch.tensor([tokenizer(prompt).input_ids])
request = manager.add_request(ids[0].tolist(), max_new_tokens=4)
try:
    with manager.pause():
        with torch.no_grad():
            logits = model(ids.to("tpu")).logits.cpu()
        tokens = model.generate(ids.to("tpu"), max_new_tokens=6, do_sample=False, disable_compile=True).cpu()
    result = manager.get_result(request_id=request, timeout=120)
finally:
    attention_during = model.config._attn_implementation
    manager.stop(block=True)
with torch.no_grad():
    r["pause"] = dict(
        logits_close=bool(torch.allclose(logits, cpu(ids).logits, atol=1e-5)),
        tokens_equal=torch.equal(tokens, cpu.generate(ids, max_new_tokens=6, do_sample=False)),
        request_equal=result.generated_tokens == cpu.generate(ids, max_new_tokens=4, do_sample=False)[0, ids.shape[1]:].tolist(),
        attention_during=attention_during, attention_after=model.config._attn_implementation,
    )
report(r)
