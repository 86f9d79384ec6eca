"""Write ``benchmarks/gpu_check.sh``'s one summary: Markdown (and JSON beside it) from the
step records the script appends and each step's log.

Input: ``--records FILE``: JSON lines, one per step that ran or was skipped, as the script
writes them: ``step``, ``status`` (``ok`` | ``failed`` | ``timeout`` | ``skipped``), ``rc``,
``wall_s``, ``timeout_s``, ``note``, ``log`` (a path; may be missing). ``--planned`` lists every
step in order, so a step with no record yet (the script was stopped before it) still gets its
section, saying so. Standard library only: it must run where the project's own dependencies
do not import. Called after every step, so a killed run still leaves a summary of what ran.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any

STATUSES = ("ok", "failed", "timeout", "skipped", "not run")
TAIL_LINES = 40
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def read_records(path: Path) -> list[dict[str, Any]]:
    """The step records; a line that is not a JSON object is reported as a failed record."""
    out: list[dict[str, Any]] = []
    if not path.exists():
        return out
    for i, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
            if not isinstance(rec, dict) or "step" not in rec:
                raise ValueError("not a step record")
        except ValueError as exc:
            rec = {"step": f"record-line-{i}", "status": "failed", "note": f"unreadable record: {exc}"}
        out.append(rec)
    return out


def log_tail(path: str | None, lines: int = TAIL_LINES) -> list[str]:
    """The last ``lines`` lines of a step's log, ANSI colours and carriage-return progress removed."""
    if not path or not Path(path).exists():
        return []
    text = _ANSI.sub("", Path(path).read_text(encoding="utf-8", errors="replace"))
    rows = [ln.rsplit("\r", 1)[-1].rstrip() for ln in text.splitlines()]
    rows = [ln for ln in rows if ln]
    return rows[-lines:]


def build(records: list[dict[str, Any]], planned: list[str], mode: str, budget_s: float,
          total_wall_s: float | None, header: dict[str, str]) -> dict[str, Any]:
    """The summary document: one entry per step (planned order, then any unplanned ones)."""
    by_step: dict[str, dict[str, Any]] = {}
    for rec in records:
        by_step[str(rec["step"])] = rec  # a rerun of a step replaces its earlier record
    names = list(planned) + [s for s in by_step if s not in planned]
    steps = []
    for name in names:
        rec = dict(by_step.get(name) or {"step": name, "status": "not run",
                                          "note": "no record: the script stopped before this step"})
        if rec.get("status") not in STATUSES:
            rec["note"] = f"unknown status {rec.get('status')!r}; {rec.get('note', '')}".strip("; ")
            rec["status"] = "failed"
        rec["tail"] = log_tail(rec.get("log"))
        steps.append(rec)
    if total_wall_s is None:
        total_wall_s = sum(float(s.get("wall_s") or 0.0) for s in steps)
    counts = {st: sum(s["status"] == st for s in steps) for st in STATUSES}
    return {"mode": mode, "header": header, "budget_s": budget_s, "total_wall_s": round(total_wall_s, 1),
            "within_budget": total_wall_s <= budget_s, "counts": counts,
            "all_passed": counts["failed"] == counts["timeout"] == counts["not run"] == 0, "steps": steps}


def _cell(x: Any) -> str:
    return str(x).replace("|", "\\|").replace("\n", " ")


def to_markdown(doc: dict[str, Any]) -> str:
    c = doc["counts"]
    lines = [f"# GPU check summary ({doc['mode']} mode)", ""]
    for k, v in doc["header"].items():
        lines.append(f"- {k}: {v}")
    lines += [f"- total wall time: {doc['total_wall_s']:.1f} s of a {doc['budget_s']:.0f} s budget "
              f"({'within' if doc['within_budget'] else 'OVER'})",
              f"- steps: {c['ok']} ok, {c['failed']} failed, {c['timeout']} timed out, {c['skipped']} skipped, "
              f"{c['not run']} not run", "",
              "| # | step | status | wall s | timeout s | note |", "|---|---|---|---|---|---|"]
    for i, s in enumerate(doc["steps"], 1):
        wall = f"{float(s['wall_s']):.1f}" if s.get("wall_s") is not None else ""
        lines.append(f"| {i} | {_cell(s['step'])} | {s['status']} | {wall} | {_cell(s.get('timeout_s') or '')} "
                     f"| {_cell(s.get('note') or '')} |")
    for i, s in enumerate(doc["steps"], 1):
        lines += ["", f"## {i}. {s['step']}: {s['status']}", ""]
        if s.get("note"):
            lines += [s["note"], ""]
        if s.get("cmd"):
            lines += [f"`{s['cmd']}`", ""]
        if s["tail"]:
            lines += ["```text", *s["tail"], "```"]
        elif s["status"] not in ("skipped", "not run"):
            lines.append("(no output)")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", required=True, type=Path)
    ap.add_argument("--planned", default="", help="comma-separated step names, in order")
    ap.add_argument("--mode", default="gpu")
    ap.add_argument("--budget-s", type=float, required=True)
    ap.add_argument("--total-wall-s", type=float, default=None)
    ap.add_argument("--header", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--out", required=True, type=Path, help="the Markdown file; the JSON goes beside it (.json)")
    a = ap.parse_args(argv)
    header = dict(h.split("=", 1) for h in a.header if "=" in h)
    doc = build(read_records(a.records), [s for s in a.planned.split(",") if s], a.mode, a.budget_s,
                a.total_wall_s, header)
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(to_markdown(doc), encoding="utf-8")
    a.out.with_suffix(".json").write_text(json.dumps(doc, indent=2), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
