"""The story ``ttft diff`` tells: what got better in B, what got worse, by how much, and which
finding on either side explains each (a trade-off told as one, e.g. chunked prefill: the ITL
tail fell, TTFT rose).

Works on a :class:`diag.analysis.report.diff.DiffResult` and both sides' findings; pure, any thread.
All durations are seconds.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from diag.ground import stages
from diag.analysis.report.deltas import MetricDelta
from diag.ground.units import Unit, fmt_s, fmt_value
from rules import Finding

if TYPE_CHECKING:
    from diag.analysis.report.diff import DiffResult

#: metrics whose change a decode-side finding explains
DECODE_FAMILIES = ("ITL", "TPOT")
#: per family, at most this many percentiles in the better/worse lines
PER_FAMILY = 2


def family(m: MetricDelta) -> str:
    """``ITL p99`` -> ``ITL``; ``output tokens`` -> ``output tokens``."""
    head, _, tail = m.name.rpartition(" ")
    return head if tail[:1] == "p" and tail[1:].isdigit() else m.name


def judged(metrics: Sequence[MetricDelta], judgement: str) -> list[MetricDelta]:
    """Metrics that got ``judgement`` ("better"/"worse") in B, biggest relative change first
    within each family and families by their biggest; server/client TTFT are dropped when
    TTFT itself is listed (the same change twice)."""
    hits = [m for m in metrics if m.judgement == judgement]
    fams: dict[str, list[MetricDelta]] = {}
    for m in hits:
        fams.setdefault(family(m), []).append(m)
    if "TTFT" in fams:
        fams.pop("server TTFT", None)
        fams.pop("client TTFT", None)

    def size(m: MetricDelta) -> float:
        return abs(m.rel) if m.rel is not None else float("inf")

    groups = [sorted(ms, key=size, reverse=True)[:PER_FAMILY] for ms in fams.values()]
    groups.sort(key=lambda g: size(g[0]), reverse=True)
    return [m for g in groups for m in g]


def _short(m: MetricDelta) -> str:
    rel = m.rel
    return f"{m.name} {rel * 100:+.0f}%" if rel is not None else f"{m.name} {m.fmt_delta()}"


def _finding_phrase(f: Finding, side: str, there: Sequence[Finding]) -> str:
    other = "B" if side == "A" else "A"
    fresh = any(x.category == f.category for x in there)
    tail = f"also in {other}" if fresh else ("new in B" if side == "B" else "gone in B")
    return f"{side}'s finding [{f.category}] {f.title}, confidence {fmt_value(f.confidence, Unit.SHARE)} - {tail}"


def _decode_line(r: DiffResult, judgement: str, fa: Sequence[Finding], fb: Sequence[Finding],
                 owners: Sequence[str]) -> tuple[str | None, Finding | None]:
    ms = [m for m in (r.better if judgement == "better" else r.worse) if family(m) in DECODE_FAMILIES]
    if not ms:
        return None, None
    side, here, there = ("B", fb, fa) if judgement == "worse" else ("A", fa, fb)
    what = ", ".join(_short(m) for m in ms)
    f = next((x for x in here if x.category in owners), None)  # the side's ranking decides
    if f is None:
        return (f"Why {judgement}: {what} - no {'/'.join(owners)} finding on the {side} side "
                "(below the rules' thresholds, or their evidence is missing)"), None
    return f"Why {judgement}: {what} - {_finding_phrase(f, side, there)}", f


def tell(r: DiffResult, fa: Sequence[Finding], fb: Sequence[Finding], rules_ran: bool,
         itl_owners: Sequence[str], slo_b: Mapping[str, float] | None) -> list[str]:
    """The story's lines; sets ``r.itl_finding`` to the finding that explains the decode side."""
    L: list[str] = []
    t, t95 = r.metric("TTFT p50"), r.metric("TTFT p95")
    if t is not None:
        L.append(f"TTFT p50 {t.fmt(t.a)} -> {t.fmt(t.b)}: {t.fmt_delta()};  p95 {t95.fmt(t95.a) if t95 else '-'} -> "
                 f"{t95.fmt(t95.b) if t95 else '-'}: {t95.fmt_delta() if t95 else '-'}")
    if r.direction == "unchanged" and not r.better and not r.worse:
        L.append("No material change in TTFT or ITL (less than 5% and 0.5 ms).")
    if r.better:
        L.append("Better in B: " + ", ".join(m.fmt_change() for m in r.better))
    if r.worse:
        L.append("Worse in B: " + ", ".join(m.fmt_change() for m in r.worse))
    why = "worse" if r.direction == "grew" else "better"
    if r.moved == "itl":
        itl = next((m for m in (*r.worse, *r.better) if family(m) == "ITL"), None) or r.metric("ITL p50")
        L.append(f"TTFT held; ITL {r.direction}: {itl.fmt_change() if itl else '-'} - a decode-side change.")
    elif r.moved == "ttft":
        L.append(f"Why {why}: TTFT {r.direction}, but no stage spans on both sides split it "
                 "(client-only captures): compare the verdicts and the load numbers below.")
    elif r.moved is not None:
        s = next(x for x in r.stages if x.stage == r.moved)
        d = r.moved_delta_s or 0.0
        L.append(f"Why {why}: TTFT - {r.moved} {'grew' if d >= 0 else 'shrank'} most: mean {('+' if d >= 0 else '-')}"
                 f"{fmt_s(abs(d))}, p50 {fmt_s(s.p50_a)} -> {fmt_s(s.p50_b)}, share of TTFT "
                 f"{fmt_value(s.share_a, Unit.SHARE)} -> {fmt_value(s.share_b, Unit.SHARE)} "
                 f"({stages.STAGE_DESCRIPTIONS.get(r.moved, '')})")
    if r.direction != "unchanged" and r.moved is not None:
        owners = "/".join(r.owner_categories) or "-"
        if not rules_ran:
            L.append(f"  Owned by the {owners} rule(s); the rule engine did not run, so no finding to match.")
        elif r.explaining is not None:
            where = "B" if r.explaining_side == "b" else "A"
            L.append("  Explained by " + _finding_phrase(r.explaining, where, fa if where == "B" else fb))
        else:
            L.append(f"  No {owners} finding on the {'B' if r.direction == 'grew' else 'A'} side: the change is below "
                     "the rules' thresholds, or their evidence is missing (see skipped rules in `ttft analyze`).")
    if rules_ran and r.moved != "itl":
        for judgement in ("better", "worse"):
            line, f = _decode_line(r, judgement, fa, fb, itl_owners)
            if line:
                L.append(line)
                r.itl_finding = r.itl_finding or f
    L.append(_verdict_line(r, slo_b))
    return [x for x in L if x]


def _verdict_line(r: DiffResult, slo_b: Mapping[str, float] | None) -> str:
    if r.verdict_a is None and r.verdict_b is None:
        return ""
    va = r.verdict_a.category if r.verdict_a else "-"
    vb = r.verdict_b.category if r.verdict_b else "-"
    line = (f"Verdict changed: {va} -> {vb}" + (f" ({r.verdict_b.title})" if r.verdict_b else "")
            if r.verdict_changed else f"Verdict unchanged: {vb}")
    if vb == "healthy" and r.worse:
        slo = ", ".join(f"{k} <= {fmt_s(v)}" for k, v in slo_b.items()) if slo_b else "no SLO given"
        line += (f" - B is judged against its own SLO ({slo}) and the rules' thresholds, not against A: "
                 + ", ".join(_short(m) for m in r.worse[:3]) + " worse than A")
    return line


__all__ = ["family", "judged", "tell"]
