"""Probe metrics with their definitions written next to them (see :data:`DEFINITIONS`).

Input: the client's :class:`RequestResult` s of one measured phase (warm-up excluded by the
caller or here) and the phase duration in seconds. All times are seconds; distributions give
count, mean, p50, p90, p95, p99 and max. Pure functions, no I/O.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Sequence
from typing import Any

import numpy as np

from collectors.probe.results import ERROR_KINDS, RequestResult
from diag.ground.units import fmt_s
from diag.ground.tables import describe

DEFINITIONS: dict[str, str] = {
    "ttft_s": "time to first token: request start (just before a connection is taken and the request "
    "sent; slot wait excluded) -> first SSE event whose choices carry non-empty text/content. Role-only, "
    "empty and usage-only chunks do not count.",
    "ttft_incl_slot_wait_s": "TTFT + slot wait: from the time the load schedule wanted the request sent "
    "(what a user arriving on schedule sees; no coordinated omission).",
    "slot_wait_s": "scheduled send time -> actual start: waiting for a free client slot (concurrency cap) "
    "or for a late client loop.",
    "conn_wait_s": "time aiohttp waited for a pooled connection (0 when the pool is sized right).",
    "itl_s": "inter-token latency per chunk: gaps between consecutive content chunks, pooled over all "
    "requests (one sample per gap, so long answers weigh more).",
    "tpot_s": "time per output token after the first: (E2E - TTFT) / (output tokens - 1), per request.",
    "e2e_s": "end to end: request start -> last SSE event (the [DONE] or usage chunk).",
    "throughput": "completed (non-error) requests, their input tokens and output tokens, divided by the "
    "measured phase's duration (first scheduled send -> last response end).",
    "goodput_rps": "requests meeting every per-request SLO (TTFT, TPOT, E2E <= limit; ITL: the request's "
    "own percentile <= limit) and without error, divided by the duration.",
    "tokens": "output tokens from the server's usage (stream_options.include_usage), else the tokenizer "
    "given with --tokenizer over the streamed text, else the number of content chunks.",
}

def distribution(values: Sequence[float] | np.ndarray) -> dict[str, Any]:
    """count, mean, p50/p90/p95/p99 and max of ``values`` (None when empty): diag.ground.tables.describe."""
    return describe(values)


def _stat(values: Sequence[float], which: str) -> float | None:
    if not len(values):
        return None
    if which == "max":
        return float(max(values))
    if which == "mean":
        return float(np.mean(values))
    return float(np.percentile(values, int(which[1:])))


def request_meets_slo(r: RequestResult, slo: dict[str, float]) -> bool:
    """Does one request meet every SLO item? Errors never do; a missing value is not a miss."""
    if r.error is not None:
        return False
    for key, limit in slo.items():
        metric, which = key.split("_", 1)
        if metric == "ttft":
            v = r.ttft_s
        elif metric == "tpot":
            v = r.tpot_s
        elif metric == "e2e":
            v = r.e2e_s
        else:
            v = _stat(r.itl_s(), which)
        if v is not None and v > limit:
            return False
    return True


def compute_metrics(results: Sequence[RequestResult], duration_s: float, slo: dict[str, float] | None = None,
                    over_context: Collection[str] = ()) -> dict[str, Any]:
    """Every probe metric for one phase (warm-up results are left out here). ``http_4xx``
    refusals in the ``over_context`` segments (where a designed experiment met the server's
    context limit) are counted apart, in ``requests.over_context``, not as requests or errors."""
    measured = [r for r in results if not r.warmup]
    n_over = 0
    if over_context:
        kept = [r for r in measured if not (r.error == "http_4xx" and r.segment in over_context)]
        n_over, measured = len(measured) - len(kept), kept
    ok = [r for r in measured if r.error is None]
    dur = max(duration_s, 1e-9)
    ttft = [r.ttft_s for r in ok if r.ttft_s is not None]
    itl = [g for r in ok for g in r.itl_s()]
    tpot = [t for r in ok if (t := r.tpot_s) is not None]
    e2e = [r.e2e_s for r in ok if r.e2e_s is not None]
    slot = [r.slot_wait_s for r in measured]
    ttft_sched = [r.ttft_s + r.slot_wait_s for r in ok if r.ttft_s is not None]
    in_tok = sum(r.input_tokens or 0 for r in ok)
    out_tok = sum(r.output_tokens or 0 for r in ok)
    errors: dict[str, dict[str, Any]] = {}
    for r in measured:
        if r.error is not None:
            e = errors.setdefault(r.error, {"count": 0, "example": r.error_detail,
                                            "meaning": ERROR_KINDS.get(r.error, "")})
            e["count"] += 1
    for e in errors.values():
        e["fraction"] = e["count"] / max(1, len(measured))
    out: dict[str, Any] = {
        "requests": {"total": len(measured), "ok": len(ok), "errors": len(measured) - len(ok),
                     "warmup_excluded": sum(1 for r in results if r.warmup), "over_context": n_over},
        "duration_s": duration_s,
        "ttft_s": distribution(ttft),
        "ttft_incl_slot_wait_s": distribution(ttft_sched),
        "slot_wait_s": distribution(slot),
        "conn_wait_s": distribution([r.conn_wait_s for r in measured]),
        "itl_s": distribution(itl),
        "tpot_s": distribution(tpot),
        "e2e_s": distribution(e2e),
        "throughput": {
            "requests_per_s": len(ok) / dur,
            "input_tokens_per_s": in_tok / dur,
            "output_tokens_per_s": out_tok / dur,
        },
        "tokens": token_report(ok),
        "output_lengths": output_length_report(ok),
        "errors": dict(sorted(errors.items(), key=lambda kv: -kv[1]["count"])),
    }
    if slo:
        out["slo"] = slo_report(out, ok, measured, slo, dur)
    return out


def token_report(ok: Sequence[RequestResult]) -> dict[str, Any]:
    """Where token counts came from, totals, and usage-vs-tokenizer discrepancy."""
    sources = Counter(r.token_source for r in ok)
    both = [(r.usage_output_tokens, r.tokenizer_output_tokens) for r in ok
            if r.usage_output_tokens is not None and r.tokenizer_output_tokens is not None]
    rep: dict[str, Any] = {
        "output_source": dict(sources),
        "input_total": int(sum(r.input_tokens or 0 for r in ok)),
        "output_total": int(sum(r.output_tokens or 0 for r in ok)),
        "input_source": "server" if ok and all(r.usage_input_tokens is not None for r in ok) else (
            "estimate (as built)" if ok else None),
    }
    if both:
        pct = [100.0 * (t - u) / u for u, t in both if u]
        rep["discrepancy"] = {
            "requests_compared": len(both),
            "requests_differing": sum(1 for u, t in both if u != t),
            "mean_abs_pct": float(np.mean(np.abs(pct))) if pct else 0.0,
            "max_abs_pct": float(np.max(np.abs(pct))) if pct else 0.0,
            "note": "(tokenizer count of the streamed text - server usage) / server usage",
        }
    return rep


def output_length_report(ok: Sequence[RequestResult]) -> dict[str, Any]:
    """Did the server produce the requested number of output tokens?"""
    checked = [r for r in ok if r.requested_output_tokens and r.output_tokens is not None]
    short = [r for r in checked if r.output_tokens < r.requested_output_tokens]  # type: ignore[operator]
    long_ = [r for r in checked if r.output_tokens > r.requested_output_tokens]  # type: ignore[operator]
    src = Counter(r.token_source for r in checked)
    rep: dict[str, Any] = {
        "requests_checked": len(checked),
        "requests_short": len(short),
        "requests_long": len(long_),
        "count_source": dict(src),
        "honoured": (not short and not long_) if checked else None,
    }
    if short:
        rep["short_example"] = {"requested": short[0].requested_output_tokens, "got": short[0].output_tokens,
                                "finish_reason": short[0].finish_reason}
    if checked and set(src) == {"chunks"}:
        rep["note"] = "counted in content chunks (no usage, no tokenizer): a chunk may hold several tokens"
    return rep


def slo_report(m: dict[str, Any], ok: Sequence[RequestResult], measured: Sequence[RequestResult],
               slo: dict[str, float], dur: float) -> dict[str, Any]:
    """Aggregate SLO checks (the distribution's percentile vs the limit) and goodput."""
    items: dict[str, Any] = {}
    for key, limit in slo.items():
        metric, which = key.split("_", 1)
        dist = m.get(f"{metric}_s") or {}
        value = dist.get(which if which in ("max", "mean") else which)
        items[key] = {"limit_s": limit, "value_s": value, "met": None if value is None else value <= limit}
    good = sum(1 for r in measured if request_meets_slo(r, slo))
    return {
        "items": items,
        "all_met": all(i["met"] is not False for i in items.values()),
        "good_requests": good,
        "goodput_rps": good / dur,
        "goodput_fraction": good / max(1, len(measured)),
    }


# --- text output --------------------------------------------------------------------------------


_ROWS = (("TTFT", "ttft_s"), ("TTFT+slot wait", "ttft_incl_slot_wait_s"), ("ITL (per chunk)", "itl_s"),
         ("TPOT", "tpot_s"), ("E2E", "e2e_s"), ("slot wait", "slot_wait_s"), ("conn wait", "conn_wait_s"))


def format_metrics(m: dict[str, Any], definitions: bool = True) -> str:
    """The end-of-run summary table."""
    req = m["requests"]
    over = (f"; {req['over_context']} refused past the context limit, the experiment's limit, not counted"
            if req.get("over_context") else "")
    lines = [f"{req['total']} requests ({req['ok']} ok, {req['errors']} errors; {req['warmup_excluded']} warm-up "
             f"excluded{over}) in {m['duration_s']:.2f} s"]
    cols = ["p50", "p90", "p95", "p99", "max", "mean"]
    lines.append(f"{'':16}" + "".join(f"{c:>9}" for c in cols))
    for label, key in _ROWS:
        d = m[key]
        if not d["count"]:
            continue
        lines.append(f"{label:16}" + "".join(f"{fmt_s(d[c]):>9}" for c in cols))
    t = m["throughput"]
    tok = m["tokens"]
    lines.append(f"throughput: {t['requests_per_s']:.2f} req/s, input {t['input_tokens_per_s']:.0f} tok/s, "
                 f"output {t['output_tokens_per_s']:.0f} tok/s (output tokens from "
                 + ", ".join(f"{k}: {v}" for k, v in tok["output_source"].items()) + ")")
    if "discrepancy" in tok:
        d = tok["discrepancy"]
        lines.append(f"token count discrepancy (tokenizer vs server usage): {d['requests_differing']}/"
                     f"{d['requests_compared']} requests differ, mean |diff| {d['mean_abs_pct']:.1f}%")
    ol = m["output_lengths"]
    if ol.get("honoured") is False:
        lines.append(f"output lengths NOT honoured: {ol['requests_short']} short, {ol['requests_long']} long of "
                     f"{ol['requests_checked']} (the server ignored min_tokens/ignore_eos or max_tokens)")
    for kind, e in m["errors"].items():
        lines.append(f"error {kind}: {e['count']} ({e['fraction'] * 100:.1f}%)  e.g. {e['example'] or ''}")
    if "slo" in m:
        s = m["slo"]
        items = ", ".join(f"{k} {fmt_s(v['value_s'])} <= {fmt_s(v['limit_s'])} "
                          f"{'ok' if v['met'] else ('BROKEN' if v['met'] is False else '?')}" for k, v in s["items"].items())
        lines.append(f"SLO: {items}; goodput {s['goodput_rps']:.2f} req/s ({s['good_requests']} requests meet every SLO)")
    if definitions:
        lines.append("definitions:")
        for k in ("ttft_s", "itl_s", "tpot_s", "slot_wait_s"):
            lines.append(f"  {k}: {DEFINITIONS[k]}")
    return "\n".join(lines)


def format_sweep_table(points: Sequence[tuple[str, dict[str, Any]]], over_context: Sequence[str] = ()) -> str:
    """One line per sweep point: TTFT p50/p99, TPOT p50, E2E p50, throughput, errors (``limit``
    for the ``over_context`` segments: refused as longer than the server's context, not failed)."""
    head = f"{'segment':<18}{'n':>5}{'err':>6}{'TTFT p50':>10}{'TTFT p99':>10}{'TPOT p50':>10}{'E2E p50':>10}{'req/s':>8}{'out tok/s':>10}"
    lines = [head]
    for label, m in points:
        lines.append(
            f"{label:<18}{m['requests']['total'] + m['requests'].get('over_context', 0):>5}"
            f"{'limit' if label in over_context else m['requests']['errors']:>6}"
            f"{fmt_s(m['ttft_s']['p50']):>10}"
            f"{fmt_s(m['ttft_s']['p99']):>10}{fmt_s(m['tpot_s']['p50']):>10}{fmt_s(m['e2e_s']['p50']):>10}"
            f"{m['throughput']['requests_per_s']:>8.2f}{m['throughput']['output_tokens_per_s']:>10.0f}"
        )
    return "\n".join(lines)
