"""``transformers-tpu doctor``'s report as text (:func:`format_text`; :mod:`.doctor` collects the report)."""

from __future__ import annotations

from typing import Any

from .. import config

__all__ = ["format_text"]


def _gib(n: int) -> str:
    return f"{n / 2**30:.1f} GiB"


def _size(n: int) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


def _compile_cache_lines(cache: dict[str, Any]) -> list[str]:
    lines = ["", "Compile cache"]
    if cache.get("root"):
        who = {"transformers-tpu-ext": "set by transformers-tpu-ext", "environment": "from the environment"}.get(
            cache.get("set_by"), ""
        )
        lines.append(f"  directory     {cache['root']}" + (f"  ({who})" if who else ""))
        if "entries" in cache:
            lines.append(f"  entries       {cache['entries']} ({_size(cache.get('bytes', 0))})")
    else:
        lines.append(f"  off           {cache.get('reason') or cache.get('error') or ''}".rstrip())
    process = cache.get("process")
    if process:
        lines.append(
            f"  this process  {process['requests']} requests, {process['hits']} hits, {process['misses']} misses"
        )
    if cache.get("on_recompile"):
        lines.append(f"  recompiles    {cache['on_recompile']} (TRANSFORMERS_TPU_EXT_COMPILE_ON_RECOMPILE)")
    return lines


def format_text(report: dict[str, Any]) -> str:
    """The plain-text report."""
    lines = [f"transformers-tpu-ext {report['plugin']['version']}", "", "Versions"]
    for dist, entry in report["versions"].items():
        installed = entry["installed"] or "not installed"
        supported = f"supported {entry['supported']}" if entry["supported"] else ""
        mark = {True: "ok", False: "UNSUPPORTED", None: ""}[entry["ok"]]
        if entry.get("untested"):
            mark = f"allowed, untested (tested: {', '.join(entry['tested'])})"
        lines.append(f"  {dist:<13} {installed:<16} {supported:<28} {mark}".rstrip())

    tpu = report["tpu"]
    lines += ["", "TPU"]
    if tpu.get("available"):
        sim = "  (simulated TPU, not a chip)" if tpu.get("simulated") else ""
        lines.append(f"  device        {tpu['name']}  generation {tpu['generation']}{sim}")
        lines.append(f"  chips         {tpu['chips']}")
        lines.append(f"  HBM per chip  {_gib(tpu['hbm_bytes'])} ({tpu['hbm_bytes']} bytes)")
        if tpu.get("chip_hbm_bytes"):
            lines.append(
                f"                (a {tpu['name']} has {_gib(tpu['chip_hbm_bytes'])}: the simulated chips keep to half of "
                "this host's memory; hbm= in TRANSFORMERS_TPU_EXT_SIMULATE sets it)"
            )
        counts = tpu.get("process_counts")
        shown = ", ".join(map(str, counts)) if counts else "unknown generation"
        lines.append(f"  launch        process counts per host: {shown}")
    else:
        seen = f"current accelerator: {tpu['accelerator']}" if tpu.get("accelerator") else "no accelerator"
        lines.append(f"  none seen ({seen}); the plugin changes nothing on this machine")

    patches = report["patches"]
    lines += ["", "Patches"]
    if patches.get("disable_env"):
        lines.append(f"  {config.DISABLE_ENV}={patches['disable_env']}")
    lines.append(f"  active        {', '.join(patches['active']) or 'none'}")
    if patches.get("armed"):
        lines.append(
            f"  armed         {', '.join(patches['armed'])}: each applies when its module is imported (Transformers' "
            "at the first from_pretrained or pipeline); their versions pass the gate (--import-targets imports "
            "them now and runs each patch's checks)"
        )
    if patches.get("library_not_installed"):
        waiting = ", ".join(f"{name} ({library})" for name, library in patches["library_not_installed"].items())
        lines.append(f"  waiting       {waiting}: the library is not installed; the patch applies once it is")
    if patches["skipped"]:
        lines.append("  skipped")
        lines += [f"    {name}: {reason}" for name, reason in patches["skipped"].items()]
    else:
        lines.append("  skipped       none")
    if patches["pending"]:
        lines.append(f"  pending       {', '.join(patches['pending'])} (target not imported yet)")

    if "compile_cache" in report:
        lines += _compile_cache_lines(report["compile_cache"])

    lines += ["", "Known problems"]
    lines += [f"  - {p}" for p in report["problems"]] or ["  none found"]
    return "\n".join(lines)
