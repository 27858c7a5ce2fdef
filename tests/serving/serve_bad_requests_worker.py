"""Worker of test_serve_bad_requests.py: runs in a fresh interpreter (tests/_subprocess.run_python) and reports one JSON value."""
from _worker import report
import tempfile, threading, time
from concurrent.futures import ThreadPoolExecutor
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
from transformers_tpu_ext.testing.tiny import check_context_sensitive, save_tiny_model

path = save_tiny_model(tempfile.mkdtemp() + "/tiny", "qwen3")
tokenizer = AutoTokenizer.from_pretrained(path)
cpu = AutoModelForCausalLM.from_pretrained(path)
check_context_sensitive(cpu)
WORDS = "the secret to baking a good cake is patience and cloud tpus run static shapes fast".split()
prompts = [" ".join(WORDS[i:] + WORDS[:i]) for i in range(10)]  # 10 different prompts, about 16 tokens each
NEW = 4

def generated(text):
    ids = torch.tensor([tokenizer(text).input_ids])
    return tokenizer.decode(cpu.generate(ids, max_new_tokens=NEW, do_sample=False)[0, ids.shape[1]:], skip_special_tokens=True)

expected = {p: generated(p) for p in prompts}
BAD = [
    ("no prompt", {"max_tokens": NEW}),
    ("empty prompt", {"prompt": "", "max_tokens": NEW}),
    ("max_tokens 0", {"prompt": prompts[0], "max_tokens": 0}),
    ("max_tokens -1", {"prompt": prompts[1], "max_tokens": -1}),
    ("too long", {"prompt": " ".join(WORDS * 8), "max_tokens": NEW}),  # past TRANSFORMERS_TPU_EXT_SERVE_MAX_LEN
]

# `transformers serve --continuous-batching` as a user runs it (Transformers 5.25 loads the model in a process of its
# own: the simulated TPU comes with TRANSFORMERS_TPU_EXT_SIMULATE, and reports what that process compiles).
from _serve_cli import Served

r = {"good": {"total": 0, "ok": 0, "wrong": []}, "bad": {}, "health": []}
stop = threading.Event()

def watch_health():
    while not stop.is_set():
        r["health"].append(server.call("GET", "/health", timeout=30)[0])
        time.sleep(0.5)

def call(body):
    return server.call("POST", "/v1/completions", {"temperature": 0, **body})

started = time.perf_counter()
with Served(str(path)) as server:
    call({"prompt": prompts[0], "max_tokens": NEW})  # starts the manager (its warm-up)
    programs = server.programs()
    watcher = threading.Thread(target=watch_health, daemon=True)
    watcher.start()
    try:
        for wave in range(2):  # 2 x 100 concurrent requests, 5 of each 100 bad
            jobs = [("good", prompts[i % 10], {"prompt": prompts[i % 10], "max_tokens": NEW}) for i in range(95)]
            jobs += [("bad", name, body) for name, body in BAD]
            jobs = [jobs[(i * 37) % 100] for i in range(100)]  # the bad ones spread among the good
            with ThreadPoolExecutor(32) as pool:
                answers = list(pool.map(lambda job: (job, call(job[2])), jobs))
            for (kind, key, body), (status, payload) in answers:
                if kind == "good":
                    r["good"]["total"] += 1
                    text = payload["choices"][0]["text"] if status == 200 else None
                    if text == expected[key]:
                        r["good"]["ok"] += 1
                    else:
                        r["good"]["wrong"].append([status, str(payload)[:200]])
                else:
                    r["bad"].setdefault(key, []).append([status, str(payload)[:300]])
        status, payload = call({"prompt": prompts[3], "max_tokens": NEW})
        r["after"] = status == 200 and payload["choices"][0]["text"] == expected[prompts[3]]
    finally:
        stop.set()
        watcher.join(30)
    engine = server.engine()
    r["engine"] = dict(patch=engine["patches"].get("continuous_batching"), programs_after_warmup=engine["counters"]["programs"] - programs,
                       process=engine["process"])
r["seconds"] = round(time.perf_counter() - started, 1)
r["transformers"] = __import__("transformers").__version__
r["health"] = sorted(set(r["health"])) + [len(r["health"])]
report(r)
