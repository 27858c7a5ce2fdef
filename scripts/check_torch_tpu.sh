#!/usr/bin/env bash
# The real torch-tpu package (with libtpu) on a machine without a TPU: the plugin must change nothing.
#
# Installs torch, then this package with its `tpu` and `jax` extras (torch-tpu 0.2.0 and libtpu, about 600 MB
# installed; JAX at the pinned version of constraints.txt, for torch-tpu's jax_op) into .venv-torch-tpu/ (reused while the pins and the declared dependencies are
# unchanged), then checks, in fresh interpreters:
#   - `import torch` runs both torch.backends entry points (torch_tpu's and ours) and works;
#   - Transformers and the plugin import; every patch is applied, none skipped, no plugin warning;
#     no TPU is detected;
#   - from_pretrained(device_map="auto") + greedy generate() on CPU give exactly the tokens (and
#     device map) of a run with TRANSFORMERS_TPU_EXT_DISABLE=1;
#   - `transformers-tpu doctor --json` reports torch_tpu and no TPU;
# then runs the tests that need no simulated TPU (the simulator cannot register its device next to
# the real backend, which owns PrivateUse1), among them tests/simulator/test_internal_apis_table.py,
# which reads the installed wheel's sources and checks the simulator's table of torch_tpu's internal
# `torch.tpu` names against them, and tests/simulator/test_jax_op_wheel.py, which loads the wheel's own
# torch_tpu/_internal/pallas/pallas.py (its C extension stubbed, tests/_torch_tpu_wheel.py), registers every
# kernel variant the serving plugin registers with its jax_op and lowers each for the TPU, and checks that
# the simulator's jax_op accepts, refuses and describes (schema) the same functions as the wheel's
# and tests/simulator/test_surface_wheel.py, which reads the wheel's table of its public surface
# (_internal/public_api.py) and checks every name, signature and NotImplementedError refusal of the simulated
# torch.tpu against the wheel's definitions, and get_pallas_mesh's refusals against the wheel's own Python
# (TORCH_TPU_SOURCES_REQUIRED=1: they fail instead of skipping when they cannot find the sources). Extra
# arguments go to pytest.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
python="${PYTHON:-python3}"
torch_pin="${TORCH_PIN:-torch==2.13.0}"
torch_tpu_pin="${TORCH_TPU_PIN:-torch-tpu==0.2.0}"
venv="${TRANSFORMERS_TPU_EXT_TORCH_TPU_VENV:-$root/.venv-torch-tpu}"

started=$SECONDS
stamp="$venv/.torch-tpu-$(printf '%s\n' "$torch_pin $torch_tpu_pin" | cat - "$root/pyproject.toml" "$root/transformers_tpu_ext/requirements.txt" "$root/constraints.txt" | sha256sum | cut -c1-16)"
if [ ! -f "$stamp" ]; then
    echo "check_torch_tpu: installing $torch_pin, $torch_tpu_pin and transformers-tpu-ext[test,tpu,jax] into $venv" >&2
    rm -rf "$venv"
    "$python" -m venv "$venv"
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check "$torch_pin"
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check -c "$root/constraints.txt" "$torch_pin" "$torch_tpu_pin" -e "$root[test,tpu,jax]"
    touch "$stamp"
fi
echo "check_torch_tpu: venv ready in $((SECONDS - started)) s" >&2
if [ -n "${CHECK_TORCH_TPU_PREPARE_ONLY:-}" ]; then  # .ci/run prepares it while the main suite runs
    exit 0
fi

export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
# torch_tpu asks for tcmalloc and logs through absl at import; neither matters here.
export PYTHONWARNINGS="ignore:<TorchTpu/Performance/TcMalloc/"
unset TRANSFORMERS_TPU_EXT_DISABLE TRANSFORMERS_TPU_EXT_SIMULATE TORCH_DEVICE_BACKEND_AUTOLOAD
workdir="$(mktemp -d)"
trap 'rm -rf "$workdir"' EXIT

"$venv/bin/python" - "$workdir" <<'PY'
import importlib, json, os, subprocess, sys, tempfile
from importlib import metadata

workdir = sys.argv[1]
SCRIPT = r'''
import importlib, json, sys, warnings
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    import torch
    import transformers
    from transformers import AutoModelForCausalLM
    import transformers_tpu_ext as ext
    from transformers_tpu_ext import backend, registry
    for name in registry.REGISTRY:
        target = importlib.import_module(registry.module_name(name)).TARGET
        if registry.installed(target):  # TRL's patch waits when the trl extra is absent
            importlib.import_module(target)
    from transformers_tpu_ext.testing import tiny
    path = sys.argv[1]
    model = AutoModelForCausalLM.from_pretrained(path, device_map="auto")
    prompt = tiny.tiny_tokenizer()(tiny.TINY_TEXT[0], return_tensors="pt")
    out = model.generate(**prompt, max_new_tokens=12, do_sample=False)
print(json.dumps({
    "torch_tpu_loaded": "torch_tpu" in sys.modules,
    "accelerator": str(torch.accelerator.current_accelerator()),
    "tpu_available": backend.tpu_available(),
    "active": ext.active_patches(),
    "registry": [n for n in registry.REGISTRY if registry.installed(importlib.import_module(registry.module_name(n)).TARGET)],
    "skipped": ext.skipped_patches(),
    "plugin_warnings": [str(w.message) for w in caught if issubclass(w.category, ext.TransformersTPUExtWarning)],
    "device_map": {k: str(v) for k, v in getattr(model, "hf_device_map", {"": model.device}).items()},
    "tokens": out.tolist(),
}))
'''


def run(extra_env):
    env = {**os.environ, **extra_env}
    proc = subprocess.run([sys.executable, "-c", SCRIPT, model_dir], capture_output=True, text=True, env=env)
    if proc.returncode:
        sys.exit(f"check_torch_tpu: the script failed:\n{proc.stdout}\n{proc.stderr}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


print("check_torch_tpu: torch", metadata.version("torch"), "torch_tpu", metadata.version("torch_tpu"),
      "libtpu", metadata.version("libtpu"), "transformers", metadata.version("transformers"),
      "accelerate", metadata.version("accelerate"), "wrapt", metadata.version("wrapt"), file=sys.stderr)
groups = {e.name for e in metadata.entry_points(group="torch.backends")}
assert {"torch_tpu", "transformers_tpu_ext"} <= groups, groups

subprocess.run([sys.executable, "-c", f"from transformers_tpu_ext.testing import tiny; tiny.save_tiny_model({workdir!r})"],
               check=True, env={**os.environ, "TRANSFORMERS_TPU_EXT_DISABLE": "1"})
model_dir = workdir
on, off = run({}), run({"TRANSFORMERS_TPU_EXT_DISABLE": "1"})

problems = []
if not on["torch_tpu_loaded"]:
    problems.append("torch_tpu was not loaded by import torch")
if on["tpu_available"] or on["accelerator"] != "None":
    problems.append(f"a TPU was detected on a machine without one: {on['accelerator']}")
if on["active"] != on["registry"]:
    problems.append(f"patches applied {on['active']} != registry {on['registry']}")
if on["skipped"] or on["plugin_warnings"]:
    problems.append(f"skipped {on['skipped']}, warnings {on['plugin_warnings']}")
if off["active"]:
    problems.append(f"TRANSFORMERS_TPU_EXT_DISABLE=1 still applied {off['active']}")
if on["device_map"] != off["device_map"]:
    problems.append(f"device map {on['device_map']} != unpatched {off['device_map']}")
if on["tokens"] != off["tokens"]:
    problems.append(f"generate() tokens differ from the unpatched run: {on['tokens']} != {off['tokens']}")

doctor = subprocess.run([os.path.join(os.path.dirname(sys.executable), "transformers-tpu"), "doctor", "--json"],
                        capture_output=True, text=True)
if doctor.returncode or "torch_tpu" not in doctor.stdout and "torch-tpu" not in doctor.stdout:
    problems.append(f"transformers-tpu doctor --json failed or does not name torch_tpu:\n{doctor.stdout}\n{doctor.stderr}")

if problems:
    sys.exit("check_torch_tpu: FAILED\n  " + "\n  ".join(problems))
print(f"check_torch_tpu: import torch/transformers/plugin OK; {len(on['active'])} patches active (every patch whose library "
      f"is installed), none skipped; "
      f"no TPU detected; device map {on['device_map']}; generate() tokens identical to the unpatched run "
      f"({len(on['tokens'][0])} tokens); doctor OK", file=sys.stderr)
PY

# The tests that need no simulated TPU.
cd "$root"
TORCH_TPU_SOURCES_REQUIRED=1 "$venv/bin/python" -m pytest -n auto --dist loadfile -q -p no:cacheprovider -rs \
    tests/core/test_activation.py tests/core/test_activation_subprocess.py tests/core/test_compat.py \
    tests/generation/test_generation_config.py tests/generation/test_buckets.py tests/parallelism/test_tp_plans.py tests/core/test_topology.py \
    tests/core/test_settings.py tests/simulator/test_internal_apis_table.py tests/simulator/test_jax_op_wheel.py \
    tests/simulator/test_surface_wheel.py \
    "tests/core/test_faults.py::test_a_failing_entry_point_is_one_warning_and_import_torch_works" "$@"
echo "check_torch_tpu: passed in $((SECONDS - started)) s" >&2
