"""The state of a ``generate()`` call on TPU, shared by the generation wrappers.

The ``generate`` wrapper (``wrap_generate``) decides what a call does and stores it in
:data:`CURRENT` (a context variable: each thread and task has its own call); the inner wrappers
(``wrap_prepare``, ``wrap_decoding``) read it. Outside a handled call, and in a call left to
upstream, every inner wrapper calls the original at once (:func:`in_handled_call`).
"""

from __future__ import annotations

import contextvars
import functools
import inspect
import logging
import threading
from dataclasses import dataclass, field
from typing import Any

from ..core.wrapping import fail_safe, warn_once
from . import config as settings_module
from . import policy
from .views import Padding

logger = logging.getLogger("transformers_tpu_ext")


@dataclass
class CallState:
    """What the ``generate`` wrapper decided for the call in flight (read by the inner wrappers)."""

    settings: settings_module.TPUGenerationConfig
    plan: policy.CallPlan
    padding: Padding = field(default_factory=Padding)
    forced_chunk: bool = False  # the plugin chose prefill_chunk_size
    user_cache_kind: str | None = None  # what the caller will see in output.cache: "static", "dynamic"
    upstream_cache_length: int = 0  # the static-cache length upstream would have chosen
    #: ``model._previous_max_cache_length`` as upstream would leave it after the call (``MISSING``: unset);
    #: the plugin's own caches never count (``wrap_prepare.prepare_cache_for_generation``).
    upstream_previous: Any = None
    #: ``(cache, mask)`` while the call's 4D masks are built on the device from ``mask`` (2D, on the
    #: TPU, as long as ``cache``): what the mask builder hands the model (``wrap_prepare``).
    device_mask: Any = None
    #: Where the user's callbacks get their tensors (``policy.callback_device``: the call's input device,
    #: or ``None`` for the host) and which callbacks are the user's (``id()`` of each processor and criterion).
    callback_device: Any = None
    #: The device of the call's inputs (where upstream's loop would keep its tensors and draw its samples).
    input_device: Any = None
    user_callbacks: frozenset = frozenset()
    #: ``recurrent.recurrent_path`` of a model with recurrent layers (its 2D mask is sliced per forward).
    recurrent: Any = None
    #: The vision-language plan of a padded call with media inputs (``multimodal.media_plan``), else ``None``,
    #: and its padded token ids (for the model's own placeholder check, ``wrap_media``).
    media: Any = None
    media_ids: Any = None


#: The call in flight in this thread or task (``None`` outside a TPU ``generate()``).
CURRENT: contextvars.ContextVar[CallState | None] = contextvars.ContextVar("transformers_tpu_ext_generate", default=None)

#: The state of a call left to upstream (every inner wrapper passes through).
UPSTREAM = CallState(settings=settings_module.TPUGenerationConfig(), plan=policy.CallPlan(True, "upstream"))


#: Signatures of the wrapped originals (``self`` dropped), taken at ``apply``.
SIGNATURES: dict[str, inspect.Signature] = {}


@functools.cache
def cache_key() -> str:
    """The name Transformers gives the cache in ``model_kwargs``, ``prepare_inputs_for_generation`` and the
    outputs: ``"cache"`` from 5.24, ``"past_key_values"`` in 5.23 (read off ``GenerateDecoderOnlyOutput``)."""
    from transformers.generation.utils import GenerateDecoderOnlyOutput

    return "cache" if "cache" in GenerateDecoderOnlyOutput.__dataclass_fields__ else "past_key_values"


def record_signature(name: str, method: Any) -> None:
    """Remember the signature of the original ``GenerationMixin`` method ``name`` (``self`` dropped)."""
    if name not in SIGNATURES:
        signature = inspect.signature(inspect.unwrap(method))
        SIGNATURES[name] = signature.replace(parameters=list(signature.parameters.values())[1:])


def bind(name: str, args: tuple, kwargs: dict) -> dict[str, Any]:
    """The call's arguments by name (``**kwargs`` flattened), per the original method's signature."""
    signature = SIGNATURES[name]
    bound = signature.bind(*args, **kwargs)
    arguments = dict(bound.arguments)
    for name, parameter in signature.parameters.items():
        if parameter.kind is inspect.Parameter.VAR_KEYWORD:
            arguments.update(arguments.pop(name, {}))
    return arguments


def custom_masks(model: Any) -> bool:
    """Whether the model builds its own generation masks (multimodal models): no device loop then."""
    return getattr(type(model), "create_masks_for_generate", None) is not None


def model_kind(model: Any) -> policy.ModelKind:
    """The facts of ``model`` the policy reads (``policy.ModelKind``)."""
    from .recurrent_cache import model_path
    from .static_cache import text_layer_types

    parameters = inspect.signature(model.forward).parameters
    encoder_decoder = bool(model.config.is_encoder_decoder)
    positions = "decoder_position_ids" if encoder_decoder else "position_ids"  # the decoder's, for an encoder-decoder
    layer_types = text_layer_types(model)
    return policy.ModelKind(
        encoder_decoder=encoder_decoder,
        family=getattr(model.config, "model_type", None),
        supports_default_cache=model._supports_default_dynamic_cache(),
        layer_types=layer_types,
        accepts_attention_mask="attention_mask" in parameters,
        accepts_position_ids=positions in parameters,
        custom_mask_function=custom_masks(model),
        causal=getattr(model.config, "is_causal", True) is not False,
        recurrent=model_path(model, layer_types),
    )


def in_handled_call(body: Any) -> Any:
    """Run ``body`` (fail-safe) inside a handled TPU ``generate()``; elsewhere call the original at once."""
    guarded = fail_safe(body)

    @functools.wraps(body)
    def wrapper(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
        state = CURRENT.get()
        if state is None or state.plan.upstream:
            return wrapped(*args, **kwargs)
        return guarded(wrapped, instance, args, kwargs)

    return wrapper


def in_padded_call(body: Any) -> Any:
    """Like :func:`in_handled_call`, only in calls where the plugin padded something."""
    guarded = fail_safe(body)

    @functools.wraps(body)
    def wrapper(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
        state = CURRENT.get()
        if state is None or not state.padding:
            return wrapped(*args, **kwargs)
        return guarded(wrapped, instance, args, kwargs)

    return wrapper


_failures_lock = threading.Lock()
_failures: set[str] = set()


def report_failure(where: str, error: Exception) -> None:
    """Log an error of the plugin's own (once per distinct error) before falling back to upstream."""
    key = f"{where}: {type(error).__name__}: {error}"
    with _failures_lock:
        first = key not in _failures
        _failures.add(key)
    if first:
        logger.warning(
            "transformers-tpu-ext: %s failed (%s: %s); falling back to the unpatched call", where, type(error).__name__, error
        )


def warn_unaccelerated(model: Any, where: str, reason: str, hint: str | None) -> None:
    """One WARNING per model class and reason for a call the plugin does not accelerate (``policy.notice``;
    nothing for the caller's own choices, which ``TRANSFORMERS_VERBOSITY=debug`` shows)."""
    message = policy.notice(type(model).__name__, where, reason, hint)
    if message is not None:
        warn_once(message)
