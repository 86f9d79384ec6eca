"""``ttft diff A B``: what changed between two captures, and which finding explains it.

Front door: :func:`diff_analyses` (two :class:`diag.analysis.Analysis`) returns a
:class:`DiffResult` with ``to_dict()`` and ``format_text()``. Latency, throughput and
resource numbers come from :mod:`diag.analysis.report.summary`; per-stage numbers from the analyses'
decompositions. The stage whose mean time moved most in the direction TTFT moved is matched
to the finding whose category owns that stage (:data:`STAGE_CATEGORIES`), looked up in B's
diagnosis when TTFT grew and in A's when it shrank. All durations are seconds.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from diag.ground import stages
from diag.analysis import Analysis, analyze_paths
from diag.analysis.report.deltas import NOISE, MetricDelta, StageDelta, material
from diag.analysis.report.diff_story import judged, tell
from diag.analysis.report.jsondoc import envelope
from diag.analysis.report.summary import latency_percentiles, resource_summary
from diag.ground.units import Unit, fmt_s, fmt_value
from rules import Finding

#: Which finding categories own a stage's time, most specific first.
STAGE_CATEGORIES: dict[str, tuple[str, ...]] = {
    stages.QUEUE: ("queue", "kv_cache", "grammar_compile", "lora_adapters", "pd_transfer"),
    stages.TOKENIZE: ("tokenize",),
    stages.PREFILL: ("prefill_compute", "interference"),
    stages.COMM: ("comm",),
    stages.SAMPLE: ("prefill_compute",),
    stages.KV_TRANSFER: ("pd_transfer",),
    stages.DETOKENIZE: ("network", "tokenize"),
    stages.NETWORK: ("network", "loadgen"),
    stages.LUMPED: ("tokenize", "network", "queue"),
    "itl": ("decode", "interference", "kv_cache"),
    "ttft": ("queue", "prefill_compute", "kv_cache", "network", "tokenize", "comm", "loadgen"),
}
@dataclass
class DiffResult:
    """What changed from A to B and the attribution."""

    a_paths: list[str]
    b_paths: list[str]
    metrics: list[MetricDelta]
    stages: list[StageDelta]
    verdict_a: Finding | None
    verdict_b: Finding | None
    direction: str  # "grew" | "shrank" | "unchanged"
    moved: str | None  # the stage (or "itl") that moved most
    moved_delta_s: float | None
    owner_categories: tuple[str, ...]
    explaining: Finding | None
    explaining_side: str | None  # "a" | "b"
    explaining_new: bool | None  # the finding fires on one side only
    itl_finding: Finding | None = None  # the finding that explains the decode side (ITL/TPOT)
    better: list[MetricDelta] = field(default_factory=list)  # material changes for the better in B
    worse: list[MetricDelta] = field(default_factory=list)  # material changes for the worse in B
    slo_b: dict[str, float] | None = None  # the SLO B was judged against (seconds)
    summary: list[str] = field(default_factory=list)

    def metric(self, name: str) -> MetricDelta | None:
        return next((m for m in self.metrics if m.name == name), None)

    @property
    def verdict_changed(self) -> bool:
        ca = self.verdict_a.category if self.verdict_a else None
        cb = self.verdict_b.category if self.verdict_b else None
        return ca != cb

    def to_dict(self) -> dict[str, Any]:
        def fv(f: Finding | None) -> dict[str, Any] | None:
            if f is None:
                return None
            return {"rule_id": f.rule_id, "category": f.category, "title": f.title, "confidence": f.confidence,
                    "explained_s": f.explained_s}

        return envelope("diff", {
            "a": self.a_paths,
            "b": self.b_paths,
            "ttft": self.direction,
            "moved": self.moved,
            "moved_delta_s": self.moved_delta_s,
            "owner_categories": list(self.owner_categories),
            "explained_by": fv(self.explaining),
            "explained_by_side": self.explaining_side,
            "explained_by_new": self.explaining_new,
            "itl_finding": fv(self.itl_finding),
            "verdict_a": fv(self.verdict_a),
            "verdict_b": fv(self.verdict_b),
            "verdict_changed": self.verdict_changed,
            "better": [m.name for m in self.better],
            "worse": [m.name for m in self.worse],
            "slo_b": self.slo_b,
            "summary": self.summary,
            "metrics": {m.name: m.to_dict() for m in self.metrics},
            "stages": {s.stage: s.to_dict() for s in self.stages},
        })

    def format_text(self) -> str:
        """The diff as text: the story first, then the metric and stage tables."""
        L = [f"A: {', '.join(self.a_paths)}", f"B: {', '.join(self.b_paths)}", ""]
        L += self.summary
        L.append("")
        w = max(len(m.name) for m in self.metrics) if self.metrics else 10
        L.append(f"{'metric':<{w}}  {'A':>10}  {'B':>10}  change")
        for m in self.metrics:
            if m.a is None and m.b is None:
                continue
            L.append(f"{m.name:<{w}}  {m.fmt(m.a):>10}  {m.fmt(m.b):>10}  {m.fmt_delta()}")
        if self.stages:
            L.append("")
            L.append(f"{'stage':<11}  {'p50 A':>9}  {'p50 B':>9}  {'mean change':>12}  {'share A':>8}  {'share B':>8}")
            for s in self.stages:
                d = s.mean_delta_s
                d = 0.0 if d is not None and abs(d) < NOISE["s"] else d
                L.append(
                    f"{s.stage:<11}  {_fd(s.p50_a):>9}  {_fd(s.p50_b):>9}  "
                    f"{(('+' if d > 0 else '-' if d < 0 else '') + fmt_s(abs(d))) if d is not None else '-':>12}  "
                    f"{_fp(s.share_a):>8}  {_fp(s.share_b):>8}"
                )
        return "\n".join(L)


def _fd(v: float | None) -> str:
    return fmt_s(v)


def _fp(v: float | None) -> str:
    return fmt_value(v, Unit.SHARE)


def _findings(analysis: Analysis) -> list[Finding]:
    """The verdict first, then the other findings (none when the rules did not run)."""
    d = analysis.diagnosis
    if d is None:
        return []
    out = [d.verdict]
    for f in d.findings:
        if not any(x.rule_id == f.rule_id and x.title == f.title for x in out):
            out.append(f)
    return out


def _verdict(analysis: Analysis) -> Finding | None:
    return analysis.diagnosis.verdict if analysis.diagnosis is not None else None


#: latency metrics: (percentiles column, label, percentiles shown); lower is better
LATENCY_METRICS: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("ttft_s", "TTFT", ("p50", "p95", "p99")), ("server_ttft_s", "server TTFT", ("p50", "p95")),
    ("client_ttft_s", "client TTFT", ("p50", "p95")), ("itl_s", "ITL", ("p50", "p95", "p99")),
    ("tpot_s", "TPOT", ("p50", "p95")), ("e2e_s", "E2E", ("p50", "p95")),
)
#: load and resource metrics: (label, unit, resource_summary key, better_when)
RESOURCE_METRICS: tuple[tuple[str, str, str, int], ...] = (
    ("requests", "per_s", "requests_per_s", 1), ("output tokens", "per_s", "output_tokens_per_s", 1),
    ("device busy", "share", "device_busy_frac", 0), ("KV usage p95", "share", "kv_usage_p95", 0),
    ("KV usage max", "share", "kv_usage_max", 0), ("waiting mean", "count", "waiting_mean", 0),
    ("waiting max", "count", "waiting_max", 0), ("preemptions", "count", "preemptions", -1),
)
#: every metric the diff reports, in table order
METRIC_NAMES: tuple[str, ...] = ("requests ok", "errors", *(f"{label} {p}" for _, label, ps in LATENCY_METRICS for p in ps),
                                 *(label for label, *_ in RESOURCE_METRICS))


def _metrics(a: Analysis, b: Analysis) -> list[MetricDelta]:
    pa, pb = latency_percentiles(a.tables), latency_percentiles(b.tables)
    ra, rb = resource_summary(a.tables), resource_summary(b.tables)
    out = [MetricDelta("requests ok", "count", float(ra["ok_requests"]), float(rb["ok_requests"]), 1),
           MetricDelta("errors", "count", float(ra["errors"]), float(rb["errors"]), -1)]
    for key, label, pcts in LATENCY_METRICS:
        out += [MetricDelta(f"{label} {p}", "s", pa[key][p], pb[key][p], -1) for p in pcts]
    out += [MetricDelta(label, unit, ra[k], rb[k], better) for label, unit, k, better in RESOURCE_METRICS]
    return out


def _stage_deltas(a: Analysis, b: Analysis) -> list[StageDelta]:
    sa: Mapping[str, Any] = a.decomposition.get("stages") or {}
    sb: Mapping[str, Any] = b.decomposition.get("stages") or {}
    out = []
    for st in stages.DECOMPOSITION_STAGES:
        ra, rb = sa.get(st), sb.get(st)
        if ra is None and rb is None:
            continue
        out.append(StageDelta(st, (ra or {}).get("p50"), (rb or {}).get("p50"), (ra or {}).get("mean"), (rb or {}).get("mean"),
                              (ra or {}).get("share_of_ttft"), (rb or {}).get("share_of_ttft")))
    return out


def diff_analyses(a: Analysis, b: Analysis) -> DiffResult:
    """Compare two analyses (A = before/baseline, B = after) and attribute the change."""
    metrics = _metrics(a, b)
    sdeltas = _stage_deltas(a, b)
    by = {m.name: m for m in metrics}
    t50, t95 = by["TTFT p50"], by["TTFT p95"]
    ttft_moved = t50 if material(t50) else (t95 if material(t95) else None)
    direction = "unchanged"
    if ttft_moved is not None and ttft_moved.delta is not None:
        direction = "grew" if ttft_moved.delta > 0 else "shrank"
    itl = by["ITL p50"] if material(by["ITL p50"]) else (by["ITL p99"] if material(by["ITL p99"]) else None)

    moved: str | None = None
    moved_delta: float | None = None
    if direction != "unchanged":
        sign = 1.0 if direction == "grew" else -1.0
        cands = [(s.stage, s.mean_delta_s) for s in sdeltas if s.mean_delta_s is not None and s.mean_delta_s * sign > 0]
        if cands:
            moved, moved_delta = max(cands, key=lambda x: x[1] * sign)
        else:
            moved, moved_delta = "ttft", ttft_moved.delta if ttft_moved else None
    elif itl is not None:
        moved, moved_delta = "itl", itl.delta
        direction = "grew" if (itl.delta or 0) > 0 else "shrank"
    owners = STAGE_CATEGORIES.get(moved or "", ())

    # The finding that explains it: on the side where the problem is (B if things got worse).
    side = "b" if direction == "grew" else "a"
    here, there = (_findings(b), _findings(a)) if side == "b" else (_findings(a), _findings(b))
    explaining = None
    for cat in owners:
        explaining = next((f for f in here if f.category == cat), None)
        if explaining is not None:
            break
    new = None
    if explaining is not None:
        new = not any(f.category == explaining.category for f in there)

    va, vb = _verdict(a), _verdict(b)
    result = DiffResult(list(a.paths), list(b.paths), metrics, sdeltas, va, vb, direction, moved, moved_delta,
                        owners, explaining, side if explaining else None, new)
    result.better, result.worse = judged(metrics, "better"), judged(metrics, "worse")
    result.slo_b = dict(b.slo) if b.slo else None
    result.summary = tell(result, _findings(a), _findings(b), a.diagnosis is not None and b.diagnosis is not None,
                          STAGE_CATEGORIES["itl"], result.slo_b)
    return result


def diff_paths(a: str | Sequence[str], b: str | Sequence[str], rules_file: str | None = None) -> DiffResult:
    """Load, analyse and diff two sides; each is one capture path or several joined by trace id."""
    def side(x: str | Sequence[str]) -> list[str]:
        return [x] if isinstance(x, str) else list(x)

    return diff_analyses(analyze_paths(side(a), rules_file=rules_file), analyze_paths(side(b), rules_file=rules_file))


__all__ = ["DiffResult", "MetricDelta", "StageDelta", "STAGE_CATEGORIES", "diff_analyses", "diff_paths"]
