"""Condenses measure.sh's `zest eval` reports into the tables of docs/quality.md.

    python3 tools/demo_model/quality_tables.py OUT/visionzip.md OUT/sere.md ...

One table a report: a row a setting, exact match overall and per task, the share of baseline (the
report's first row unless --baseline names a setting or --base-exact gives the figure), visual tokens kept,
TTFT and the engine's mean decode step (TPOT in these runs also holds other items' image encoding).
"""
from __future__ import annotations

import argparse
import re
from pathlib import Path

TASKS = ["reading", "tables", "charts", "scenes", "multi", "text"]


def parse(report: str) -> tuple[dict, dict]:
    """{setting: overall row fields} and {task: {setting: exact}} from a zest eval markdown report."""
    overall: dict[str, dict] = {}
    per_task: dict[str, dict[str, float]] = {}
    section = None
    for line in report.splitlines():
        m = re.match(r"## (Overall|Task (\w+))", line)
        if m:
            section = m.group(2) or "all"
            continue
        if not section or not line.startswith("| ") or line.startswith("| setting"):
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        setting, exact = cells[0], float(cells[2])
        if section == "all":
            overall[setting] = {"exact": exact, "before": float(cells[5]), "after": float(cells[6]),
                                "ttft": float(cells[7]), "tpot": float(cells[8]), "step": float(cells[9])}
        else:
            per_task.setdefault(section, {})[setting] = exact
    return overall, per_task


def table(path: str, baseline: str | None, base_exact: float | None = None) -> str:
    overall, per_task = parse(Path(path).read_text())
    if not overall:
        return f"({path}: no rows)\n"
    base = overall[baseline] if baseline in overall else next(iter(overall.values()))
    if base_exact is not None:
        base = {"exact": base_exact}
    tasks = [t for t in TASKS if t in per_task]
    head = ["setting", "all %", "of baseline"] + tasks + ["visual tokens kept", "TTFT ms", "decode step ms"]
    rows = ["| " + " | ".join(head) + " |", "|" + "---|" + "---:|" * (len(head) - 1)]
    for s, r in overall.items():
        share = 100.0 * r["exact"] / base["exact"] if base["exact"] else float("nan")
        kept = f"{r['after']:.1f} / {r['before']:.1f}"
        cells = [s or "default", f"{r['exact']:.1f}", f"{share:.1f}%"] + [f"{per_task[t].get(s, float('nan')):.1f}" for t in tasks]
        cells += [kept, f"{r['ttft']:.1f}", f"{r['step']:.2f}"]
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("reports", nargs="+")
    ap.add_argument("--baseline", help="the setting that is 100%% (default: each report's first row)")
    ap.add_argument("--base-exact", type=float, help="the overall exact match that is 100%% (a report without a baseline row)")
    a = ap.parse_args()
    for r in a.reports:
        print(f"**{Path(r).stem}**\n")
        print(table(r, a.baseline, a.base_exact))


if __name__ == "__main__":
    main()
