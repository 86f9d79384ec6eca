"""What one step of ``ttft diagnose`` showed, as the plan reads it: a :class:`Point` per probe
chunk (one load level or one prompt length), built from the probe's per-phase metrics
(:func:`collectors.probe.compute_metrics`). Times in seconds, lengths in tokens; None when the
step did not measure it (no completed request, a single token per answer). Pure data.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

#: Point kinds: the lone-request baseline (also the ramp's first level), a prompt-ladder rung,
#: a concurrency-ramp level, an open-loop rate level, a shared-prefix follow-up, a level of the
#: long ramp (requests in flight at the long prompt), the long prompt with answers of ``value``
#: tokens, the mixed follow-up (long prompts of ``value`` tokens among short streams).
KINDS = ("baseline", "prompt", "concurrency", "rate", "prefix", "long", "longout", "mixed", "grammar", "lora")


@dataclass(frozen=True)
class Point:
    """One probe chunk's numbers. ``value`` is prompt tokens (prompt), requests in flight
    (baseline, concurrency) or requests/s (rate); ``wall_s`` is what the chunk took."""

    kind: str
    value: float
    segment: str
    requests: int
    ok: int
    wall_s: float
    ttft_p50_s: float | None = None
    ttft_p99_s: float | None = None
    itl_p50_s: float | None = None
    tpot_p50_s: float | None = None
    e2e_p50_s: float | None = None
    rps: float = 0.0
    input_tokens_mean: float | None = None
    slot_wait_p90_s: float | None = None
    errors: dict[str, int] = field(default_factory=dict)
    error_example: str | None = None
    slo_met: bool | None = None
    goodput_rps: float | None = None
    #: the probe's own stop reason for a sweep point (errors, SLO broken, slot wait), if any
    stop: str | None = None
    #: requests refused as longer than the server's context (a ladder rung past it): the
    #: experiment's limit, in neither ``requests`` nor ``errors``
    over_context: int = 0

    @property
    def failed(self) -> int:
        return self.requests - self.ok

    @property
    def error_frac(self) -> float:
        return self.failed / self.requests if self.requests else 0.0

    @property
    def service_s(self) -> float | None:
        """e2e − TTFT at the median: how long a stream occupies the server after its first token."""
        if self.e2e_p50_s is None or self.ttft_p50_s is None:
            return None
        return max(0.0, self.e2e_p50_s - self.ttft_p50_s)

    @property
    def refused_too_long(self) -> bool:
        """The server refused this chunk's prompts as longer than its context."""
        return self.over_context > 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Point:
        return cls(**d)


def point_from_metrics(kind: str, value: float, segment: str, metrics: dict[str, Any], wall_s: float,
                       stop: str | None = None) -> Point:
    """A :class:`Point` from one phase's probe metrics (``compute_metrics`` output)."""
    if kind not in KINDS:
        raise ValueError(f"unknown point kind {kind!r}")
    req = metrics["requests"]
    ok = int(req["ok"])
    tok = metrics.get("tokens") or {}
    slo = metrics.get("slo")
    errors = {k: int(v["count"]) for k, v in (metrics.get("errors") or {}).items()}
    example = next((v.get("example") for v in (metrics.get("errors") or {}).values() if v.get("example")), None)
    return Point(
        kind=kind, value=float(value), segment=segment, requests=int(req["total"]), ok=ok, wall_s=float(wall_s),
        ttft_p50_s=metrics["ttft_s"]["p50"], ttft_p99_s=metrics["ttft_s"]["p99"], itl_p50_s=metrics["itl_s"]["p50"],
        tpot_p50_s=metrics["tpot_s"]["p50"], e2e_p50_s=metrics["e2e_s"]["p50"],
        rps=float(metrics["throughput"]["requests_per_s"]),
        input_tokens_mean=(tok.get("input_total", 0) / ok) if ok and tok.get("input_total") else None,
        slot_wait_p90_s=metrics["slot_wait_s"]["p90"], errors=errors,
        error_example=str(example)[:200] if example else None,
        slo_met=None if not slo else bool(slo["all_met"]), goodput_rps=None if not slo else float(slo["goodput_rps"]),
        stop=stop, over_context=int(req.get("over_context", 0)),
    )


def goodput(points: list[Point], slo: dict[str, float] | None, ramp: str) -> dict[str, Any]:
    """The highest ramp level (baseline included) the server held: within every SLO and without
    failures when an SLO is given, else before the first level that broke; with its goodput."""
    levels = sorted((p for p in points if p.kind in ("baseline", ramp)),
                    key=lambda p: (p.kind != "baseline" if ramp == "rate" else 0, p.value))
    if not levels:
        return {"held": None, "why": "no load level ran"}
    if slo:
        good = [p for p in levels if p.slo_met and p.failed == 0]
        if not good:
            return {"held": None, "slo": slo, "goodput_rps": 0.0,
                    "why": "no level met every SLO (the lone request included)"}
        top = max(good, key=lambda p: p.goodput_rps or 0.0)
        return {"held": top.segment, "slo": slo, "goodput_rps": top.goodput_rps, "rps": top.rps,
                "why": f"highest goodput within the SLO at {top.segment}"}
    ok = [p for p in levels if p.failed == 0 and p.stop is None]
    top = max(ok, key=lambda p: p.rps) if ok else None
    return {"held": top.segment if top else None, "slo": None, "rps": top.rps if top else None,
            "why": "no --slo given: the highest throughput without failures (give --slo for goodput)"}


__all__ = ["KINDS", "Point", "goodput", "point_from_metrics"]
