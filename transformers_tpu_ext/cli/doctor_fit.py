"""``transformers-tpu doctor --fit MODEL_OR_CONFIG``: which TPUs hold a model, from its config alone.

The options (:func:`add_arguments`), the checks that make a bad combination one error line before
anything loads (:func:`check`), and the report (:func:`report`, :func:`transformers_tpu_ext.quantization.fit_report`
on the meta device). See ``docs/quantization.md``.
"""

from __future__ import annotations

import argparse
import json
import warnings

from ..core import topology
from .args import CommandError, int_list, names, non_negative_int, positive_int
from .models import resolve_model
from .running import describe

__all__ = ["OPTIONS", "add_arguments", "check", "report"]

#: The ``--fit`` options and their defaults (given without ``--fit``, they are a usage error).
OPTIONS = {"chips": None, "generation": None, "weights": None, "kv": ["bf16"], "context": 4096, "batch": 1}


def _counts(text: str) -> list[int]:
    return int_list(text, what="chip counts")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``fit report`` group of options."""
    from ..quantization.capacity import CHIPS, KV_FORMATS, WEIGHT_FORMATS

    fit = parser.add_argument_group(
        "fit report", "--fit MODEL_OR_CONFIG: which TPUs hold a model, from its config alone (meta device, no weights)"
    )
    fit.add_argument("--fit", metavar="MODEL_OR_CONFIG", help="a Hub id, a local folder or a config.json")
    fit.add_argument("--chips", type=_counts, help="chip counts to show, e.g. 1 or 1,4 (default: every topology)")
    fit.add_argument("--generation", type=names(CHIPS, "TPU generation"), help="TPU generations to show, e.g. v5e,v6e (default: all)")
    fit.add_argument("--weights", type=names(WEIGHT_FORMATS, "weights format"), help="weight formats: bf16, int8, fp8 (default: all three)")
    fit.add_argument("--kv", type=names(KV_FORMATS, "KV cache format"), help="KV cache formats: bf16, int8 (the opt-in int8 KV cache: TRANSFORMERS_TPU_EXT_GENERATE_KV_CACHE=int8; default: bf16)")
    fit.add_argument("--context", type=non_negative_int, help="cached positions a decode step reads (default: 4096)")
    fit.add_argument("--batch", type=positive_int, help="rows decoded together (default: 1)")


def check(args: argparse.Namespace) -> None:
    """Raise ``CommandError`` for options that cannot work together; fill in the ``--fit`` defaults."""
    given = [f"--{name}" for name in OPTIONS if getattr(args, name) is not None]
    if args.fit is None:
        if given:
            raise CommandError(f"{given[0]} shapes the fit report: add --fit MODEL_OR_CONFIG, or drop {given[0]}")
        return
    if getattr(args, "import_targets", False):
        raise CommandError("--import-targets is for the installation report: drop it, or drop --fit")
    for name, default in OPTIONS.items():
        if getattr(args, name) is None:
            setattr(args, name, default)
    if args.chips is not None:
        generations = args.generation or list(topology.TOPOLOGIES)
        if not any(n in topology.TOPOLOGIES.get(gen, ()) for gen in generations for n in args.chips):
            listed = "; ".join(f"{gen}: {', '.join(map(str, topology.TOPOLOGIES.get(gen, ())))}" for gen in generations)
            chips = ",".join(map(str, args.chips))
            raise CommandError(f"--chips {chips}: no TPU shown runs that many chips ({listed}); pass one of those counts")


def report(args: argparse.Namespace) -> int:
    """Print the fit report of ``args.fit`` (found first: one error line, exit status 2, when it cannot be made)."""
    from ..quantization import capacity
    from ..quantization import fit_report

    resolve_model(args.fit, option="--fit", config_file=True)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            reports = fit_report(
                args.fit,
                chips=args.chips,
                generations=args.generation,
                weights=args.weights,
                kv=args.kv,
                context=args.context,
                batch=args.batch,
            )
    except (OSError, ValueError) as error:
        raise CommandError(f"--fit {args.fit!r}: {describe(error)}") from None
    if args.json:
        print(json.dumps([one.asdict() for one in reports], indent=2))
    else:
        print(capacity.format_report(reports))
    return 0
