"""Results as Markdown (``--markdown PATH``), the form BENCHMARKS.md quotes."""
from __future__ import annotations

from typing import Dict, List, Optional

from .common import Result, fmt




def fmt_ratio(ratio: Optional[float]) -> str:
    """Three decimals near 1 (so 0.795 does not print as a passing 0.80)."""
    if ratio is None:
        return ""
    return f"{ratio:.3f}" if ratio < 10 else f"{ratio:.1f}"


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def to_markdown(results: List[Result], machine: Dict[str, str], command: str,
                failures: List[str]) -> str:
    """A Markdown table of ``results`` plus what and how they were measured."""
    lines = [f"Command: `{command}`", "",
             "Machine: " + ", ".join(f"{k} {v}" for k, v in machine.items()), "",
             "| workload | benchmark | measured | reference (same run) | ratio | target | ok "
             "| CPU µs/job client / Redis | verified |",
             "|---|---|---:|---|---:|---|:-:|---:|---|"]
    for r in results:
        ref = fmt(r.reference, r.unit) if r.reference is not None else ""
        if r.reference_label:
            ref = f"{ref} ({r.reference_label})" if ref else r.reference_label
        ok = {True: "yes", False: "**no**", None: ""}[r.ok]
        cpu = ""
        if "client_cpu_us_per_job" in r.details:
            cpu = (f"{r.details['client_cpu_us_per_job']:.1f} / "
                   f"{r.details['redis_cpu_us_per_job']:.1f}")
        ratio = fmt_ratio(r.ratio)
        lines.append("| " + " | ".join(_cell(x) for x in (
            r.workload, r.name, fmt(r.value, r.unit), ref, ratio, r.target, ok, cpu,
            r.verified)) + " |")
    for failure in failures:
        lines.append(f"\nFAILED: {failure}")
    return "\n".join(lines) + "\n"
