"""Points of ``ttft diagnose``'s plan built by hand for its tests: one per step, at a prompt length or
a load, with the TTFT and decode figures a test sets (s), and a lone-request baseline with a short
prompt ladder above it."""

from __future__ import annotations

from dataclasses import replace

from diag.analysis.diagnose import Point
from diag.analysis.diagnose.plan import segment_of


def pt(kind: str, value: float, ttft: float, tpot: float = 0.004, n: int = 8, ok: int | None = None,
       tokens: float | None = None, **kw) -> Point:
    ok = n if ok is None else ok
    return Point(kind, value, segment_of(kind, value), n, ok, 1.0, ttft_p50_s=ttft, ttft_p99_s=ttft * 1.2,
                 itl_p50_s=tpot, tpot_p50_s=tpot, e2e_p50_s=ttft + 30 * tpot, rps=n / 1.0,
                 input_tokens_mean=tokens if tokens is not None else (value if kind == "prompt" else 64.0), **kw)


BASE = pt("baseline", 1, 0.010)
LADDER = [pt("prompt", 128, 0.017), pt("prompt", 256, 0.030), pt("prompt", 512, 0.060)]


def too_long(value: float) -> Point:
    """A rung whose one request was refused as longer than the server's context (counted apart)."""
    return replace(pt("prompt", value, 0.0, n=0, ok=0, over_context=1,
                      error_example="HTTP 400: This model's maximum context length is 300 tokens"),
                   ttft_p50_s=None, ttft_p99_s=None, e2e_p50_s=None)
