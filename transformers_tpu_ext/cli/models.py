"""The model a command is given (``demo --model``, ``warmup MODEL``, ``doctor --fit``), found before anything loads.

:func:`resolve_model` answers at once, in one line, what Transformers would answer after a minute of
Hub retries and a long traceback: a path that does not exist, a directory that holds no model, a
name that is not a Hub id, a model that is neither local nor cached while the Hub is offline or
unreachable.
"""

from __future__ import annotations

import json
import os

from .args import CommandError

__all__ = ["HUB_TIMEOUT", "check_model_directory", "resolve_model"]

#: Seconds to wait for the Hub before saying it cannot be reached.
HUB_TIMEOUT = 10.0
_EXAMPLE = "a Hub id such as Qwen/Qwen3-0.6B"


def check_model_directory(path: str, option: str = "--model") -> None:
    """Raise :class:`CommandError` unless the directory ``path`` holds a model's ``config.json`` (a JSON object)."""
    config = os.path.join(path, "config.json")
    if not os.path.isfile(config):
        raise CommandError(
            f"{option} {path!r}: this directory has no config.json, so it holds no Hugging Face model; pass a "
            f"directory save_pretrained() wrote, or {_EXAMPLE}."
        )
    try:
        with open(config, encoding="utf-8") as handle:
            data = json.load(handle)
    except (OSError, ValueError) as error:
        raise CommandError(f"{option} {path!r}: its config.json cannot be read ({error}); fix or replace the file.") from None
    if not isinstance(data, dict):
        raise CommandError(f"{option} {path!r}: its config.json is not a JSON object; fix or replace the file.")


def _offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in {"1", "true", "yes", "on"}


def resolve_model(name: str, option: str = "--model", timeout: float = HUB_TIMEOUT, config_file: bool = False) -> str:
    """``name`` if it can be loaded: a local model directory, a Hub id in the cache, or one the Hub has
    (with ``config_file``, a ``config.json`` file too). ``option`` names the argument in the message.

    Raises :class:`CommandError` at once otherwise (Transformers would retry the Hub for about a minute,
    then raise a long traceback): exit status 2 for a name that cannot work, 1 when the Hub cannot be asked.
    """
    if os.path.isdir(name):
        check_model_directory(name, option)
        return name
    if config_file and os.path.isfile(name):
        return name
    if os.path.exists(name) or name.startswith((".", "/", "~")) or name.count("/") > 1:
        what = "a file, not a model directory" if os.path.exists(name) else "no such directory"
        return _refuse(f"{option} {name!r}: {what}; pass a local model directory or {_EXAMPLE}.")
    from huggingface_hub import HfApi, try_to_load_from_cache
    from huggingface_hub.utils import HfHubHTTPError, HFValidationError

    try:
        cached = try_to_load_from_cache(name, "config.json")
    except HFValidationError:
        return _refuse(f"{option} {name!r}: not a local directory and not a valid Hub id; pass a local model directory or {_EXAMPLE}.")
    if isinstance(cached, str):
        return name
    if _offline():
        return _refuse(
            f"{option} {name!r}: not a local directory and not in the Hugging Face cache, and HF_HUB_OFFLINE is set; "
            "download it first (unset HF_HUB_OFFLINE) or pass a local directory."
        )
    try:
        HfApi().model_info(name, timeout=timeout)
    except HfHubHTTPError as error:
        status = getattr(getattr(error, "response", None), "status_code", None)
        if status in (401, 403, 404):
            return _refuse(
                f"{option} {name!r}: no such model on the Hugging Face Hub (or it is private or gated: "
                f"log in with `hf auth login`); pass {_EXAMPLE} or a local directory."
            )
        return _refuse(f"{option} {name!r}: the Hugging Face Hub answered {error}; try again later.", exit_code=1)
    except Exception as error:  # noqa: BLE001 - no network, DNS, timeout
        return _refuse(
            f"{option} {name!r}: not a local directory, not in the Hugging Face cache, and the Hub cannot be reached "
            f"({type(error).__name__}: {error}); pass a local directory, or run where the Hub is reachable.",
            exit_code=1,
        )
    return name


def _refuse(message: str, exit_code: int = 2) -> str:
    raise CommandError(message, exit_code)
