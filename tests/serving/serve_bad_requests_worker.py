"""Worker of test_serve_bad_requests.py: runs in a fresh interpreter (tests/_subprocess.run_python) and reports one JSON value."""
from _worker import report
import json, os, signal, socket, subprocess, sys, tempfile, threading, time, urllib.error, urllib.request
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

# `transformers serve --continuous-batching` (Transformers 5.25 loads the model in a process of its own:
# the simulated TPU comes with TRANSFORMERS_TPU_EXT_SIMULATE, installed by the plugin's entry point there).
with socket.socket() as s:
    s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]
env = {**os.environ, "TRANSFORMERS_TPU_EXT_SIMULATE": "chips=1,hbm=128MiB"}
cli = os.path.join(os.path.dirname(sys.executable), "transformers")
server = subprocess.Popen([cli, "serve", str(path), "--continuous-batching", "--port", str(port), "--host", "127.0.0.1"],
                          env=env, stdout=subprocess.DEVNULL, stderr=open(os.path.join(tempfile.mkdtemp(), "serve.log"), "w"),
                          start_new_session=True)
url = f"http://127.0.0.1:{port}"

def call(method, route, body=None):
    data = None if body is None else json.dumps({"model": str(path), "temperature": 0, **body}).encode()
    request = urllib.request.Request(url + route, data=data, method=method, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=600) as response:
            return response.status, json.loads(response.read() or b"null")
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()[:400]

r = {"good": {"total": 0, "ok": 0, "wrong": []}, "bad": {}, "health": []}
stop = threading.Event()

def watch_health():
    while not stop.is_set():
        r["health"].append(call("GET", "/health")[0])
        time.sleep(0.5)

try:
    for _ in range(600):
        try:
            urllib.request.urlopen(url + "/health", timeout=1); break
        except Exception:
            time.sleep(0.5)
    call("POST", "/v1/completions", {"prompt": prompts[0], "max_tokens": NEW})  # starts the manager (its warm-up)
    watcher = threading.Thread(target=watch_health, daemon=True)
    watcher.start()
    for wave in range(2):  # 2 x 100 concurrent requests, 5 of each 100 bad
        jobs = [("good", prompts[i % 10], {"prompt": prompts[i % 10], "max_tokens": NEW}) for i in range(95)]
        jobs += [("bad", name, body) for name, body in BAD]
        jobs = [jobs[(i * 37) % 100] for i in range(100)]  # the bad ones spread among the good
        with ThreadPoolExecutor(32) as pool:
            answers = list(pool.map(lambda job: (job, call("POST", "/v1/completions", job[2])), jobs))
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
    r["after"] = call("POST", "/v1/completions", {"prompt": prompts[3], "max_tokens": NEW})[1]["choices"][0]["text"] == expected[prompts[3]]
finally:
    stop.set()
    os.killpg(server.pid, signal.SIGTERM)  # the server and the model's process it started
    server.wait(60)
r["health"] = sorted(set(r["health"])) + [len(r["health"])]
report(r)
