"""Which Hub-kernels call on TPU takes which path (pure: plain facts in, a decision out).

Transformers 5.25 turns Hub kernels on by default: ``from_pretrained`` resolves ``use_kernels=None`` to
``True`` (unless ``USE_HUB_KERNELS`` says no) and ``model.train()`` re-kernelizes a kernelized model for
the training mode. ``kernels`` 0.19 knows the ``tpu`` device type, but Transformers' kernel mapping names
no TPU kernel for any layer: on a TPU, kernelizing would only rebind every layer's torch forward, and a
TPU kernel, once one is mapped, wraps JAX/Pallas code and needs ``jax``.

So, on a TPU:

- **default** (the user asked for nothing: ``use_kernels`` left unset, no ``kernel_config``/``kernels_mode``,
  and ``train()`` of a model whose kernels were that default): kernelization is skipped, as with
  ``USE_HUB_KERNELS=0``. The model keeps its torch forwards: what Transformers 5.23-5.24 gave, and what
  the plugin compiles and buckets. A model kernelized by default on the CPU and moved to the TPU gets its
  torch forwards back at its next ``train()``/``eval()``.
- **requested** (``use_kernels=True``, ``kernel_config=...``, ``kernels_mode=...``, ``model.use_kernels =
  True``, ``kernelize(model)``, a Hub ``attn_implementation``): where a TPU kernel would be loaded (a
  ``kernel_config``'s mapping is made for the model's device; Transformers' own mapping when it names a ``tpu``
  kernel) and ``jax`` is missing, an ``ImportError`` naming the install command, before anything is loaded
  from the Hub; otherwise Transformers' own call (with no TPU kernel mapped, ``kernels`` keeps the torch
  forwards, as it does on any device without a kernel).

Everywhere else (no TPU) the call is Transformers', untouched.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["KernelsPlan", "kernels_path", "path_table"]

UPSTREAM = "upstream"
SKIP = "skip"
REFUSE = "refuse"


@dataclass(frozen=True)
class KernelsPlan:
    """``path``: ``"upstream"`` (Transformers' call, untouched), ``"skip"`` (no kernelization: torch forwards)
    or ``"refuse"`` (the ``ImportError`` naming the install command); ``reason``: one line saying why."""

    path: str
    reason: str


def kernels_path(*, on_tpu: bool, requested: bool, enable: bool, jax: bool, tpu_kernels: bool = True) -> KernelsPlan:
    """The path of one ``set_use_kernels``/``kernelize`` call.

    ``on_tpu``: the model (or its device map) is on a TPU; ``requested``: the user asked for Hub kernels
    (not Transformers' default); ``enable``: the call turns kernels on (``False``: a reset, which loads
    nothing); ``jax``: jax can be imported; ``tpu_kernels``: the mapping the call uses names a TPU kernel (a
    ``kernel_config``'s always does: it is made for the model's device).
    """
    if not on_tpu:
        return KernelsPlan(UPSTREAM, "not on a TPU")
    if not enable:
        return KernelsPlan(UPSTREAM, "turning Hub kernels off loads nothing")
    if not requested:
        return KernelsPlan(
            SKIP,
            "Transformers' default Hub kernels stay off on TPU (its kernel mapping has no TPU kernel; "
            "use_kernels=True asks for them)",
        )
    if not tpu_kernels:
        return KernelsPlan(UPSTREAM, "no TPU kernel is mapped: kernels keeps the torch forwards, as on any device without one")
    if not jax:
        return KernelsPlan(REFUSE, "Hub kernels on TPU wrap JAX/Pallas code and jax is not installed")
    return KernelsPlan(UPSTREAM, "requested, with jax installed")


#: The markers of the generated table in docs/doctor.md (``python scripts/gen_docs_tables.py``).
BEGIN = "<!-- generated: transformers_tpu_ext.kernels.policy.path_table() -->"
END = "<!-- end of generated Hub kernels table -->"

_EXAMPLES: tuple[tuple[str, bool, bool, bool, bool, bool], ...] = (
    ("`from_pretrained(...)` (Transformers 5.25 turns kernels on by default), then `model.train()`", True, False, True, False, True),
    ("the same with jax installed", True, False, True, True, True),
    ("`from_pretrained(..., kernel_config=...)`, `kernelize(model, kernel_config=...)`", True, True, True, False, True),
    ("`use_kernels=True`, `model.use_kernels = True`, `kernelize(model)` with Transformers' mapping, which names a TPU kernel",
     True, True, True, False, True),
    ("the same with jax installed", True, True, True, True, True),
    ("the same with Transformers' mapping of 5.25 (no TPU kernel)", True, True, True, False, False),
    ("`model.use_kernels = False`, `reset_kernels()`", True, True, False, False, True),
    ("any call on a model that is not on a TPU", False, True, True, False, True),
)


def path_table() -> str:
    """The markdown table of docs/doctor.md's "Hub kernels on TPU", computed by :func:`kernels_path`."""
    names = {UPSTREAM: "Transformers', untouched", SKIP: "no kernelization (torch forwards)", REFUSE: "`ImportError` naming the install command"}
    lines = ["| call | path | why |", "|---|---|---|"]
    for call, on_tpu, requested, enable, jax, tpu_kernels in _EXAMPLES:
        plan = kernels_path(on_tpu=on_tpu, requested=requested, enable=enable, jax=jax, tpu_kernels=tpu_kernels)
        lines.append(f"| {call} | {names[plan.path]} | {plan.reason} |")
    return "\n".join(lines)
