"""Sweeps: each point is a labelled segment (ATTR_SEGMENT, e.g. ``prompt=512``) of one capture.

* ``prompt``: input length at concurrency 1 (64, 128, ... up to ``max_value``, default 4096)
  — TTFT vs prompt length is the prefill-compute evidence; stops at the first point the server
  refuses as longer than its context (the experiment's limit, recorded by the session:
  :mod:`collectors.probe.context_limit`), or when a whole point fails.
* ``concurrency``: 1, 2, 4, ... up to ``max_value`` (default 64) at a fixed prompt — stops
  after the first point with errors or a broken SLO.
* ``rate``: 1, 2, 4, ... requests/s up to ``max_value`` (default 32) — stops after errors, a
  broken SLO, or when requests queue for a client slot (slot wait p90 > 1 s).
* ``lora``: how many of the ``--lora`` adapters the requests ask for, at the same load: 1 (every
  request for the first: the control) and all of them (``max_value``); more points with values.
  TTFT with all of them against one is what waiting for an adapter slot costs.
* ``long_every``: the ``--inject-long TOKENS:EVERY`` design at the same load in two points: no
  long prompt (``long_every=0``, the control) and every EVERY-th prompt long (``long_every=EVERY``). Short
  requests' TTFT in the second against the first is what a long prompt ahead of them costs; with
  the long prompts alone, a long one may be unfinished whenever a short one arrives, and nothing
  then says what a short request takes without one.

Pure planning and stop rules; :func:`collectors.probe.run.run_sweep` runs the points, one session
phase each.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from collectors.probe.load import LoadSpec

SWEEP_KINDS = ("prompt", "concurrency", "rate", "lora", "long_every")
DEFAULT_MAX = {"prompt": 4096, "concurrency": 64, "rate": 32, "lora": 2, "long_every": 4}
_START = {"prompt": 64, "concurrency": 1, "rate": 1, "lora": 1, "long_every": 0}


class SweepError(ValueError):
    """A bad sweep spec (one line)."""


@dataclass
class SweepSpec:
    """What to sweep. ``values`` None = the doubling defaults up to ``max_value``."""

    kind: str
    values: list[float] | None = None
    max_value: float | None = None
    requests_per_point: int | None = None
    duration_per_point_s: float | None = None

    def __post_init__(self) -> None:
        if self.kind not in SWEEP_KINDS:
            raise SweepError(f"unknown sweep {self.kind!r}: expected one of {', '.join(SWEEP_KINDS)}")
        if self.values is not None:
            if not self.values:
                raise SweepError("--sweep-values is empty")
            if any(v < 0 or (v == 0 and self.kind != "long_every") for v in self.values):
                raise SweepError("--sweep-values must be > 0")
            if self.kind != "rate" and any(v != int(v) for v in self.values):
                raise SweepError(f"--sweep-values for {self.kind} must be whole numbers")

    def point_values(self) -> list[float]:
        if self.values is not None:
            return list(self.values)
        top = self.max_value or DEFAULT_MAX[self.kind]
        if self.kind == "lora":  # the control (one adapter) and all of them
            return sorted({1.0, float(top)})
        if self.kind == "long_every":  # the control (no long prompt) and every top-th prompt long
            return [0.0, float(top)]
        out, v = [], float(_START[self.kind])
        while v <= top:
            out.append(v)
            v *= 2
        return out or [float(top)]

    def describe(self) -> dict[str, Any]:
        return {"kind": self.kind, "values": self.point_values(), "requests_per_point": self.requests_per_point,
                "duration_per_point_s": self.duration_per_point_s}


def parse_values(text: str) -> list[float]:
    """``"1,2,4"`` -> [1.0, 2.0, 4.0] (raises SweepError)."""
    try:
        return [float(x) for x in text.split(",") if x.strip()]
    except ValueError as exc:
        raise SweepError(f"bad --sweep-values {text!r}: expected numbers separated by commas") from exc


def label(kind: str, value: float) -> str:
    return f"{kind}={value:g}"


def point_load(spec: SweepSpec, value: float, base: LoadSpec, user_set_concurrency: bool) -> LoadSpec:
    """The load of one sweep point (the user's requests/duration per point, or a default)."""
    n, dur = spec.requests_per_point, spec.duration_per_point_s
    if spec.kind in ("lora", "long_every"):  # the user's load at every point; only the adapters / long prompts change
        return replace(base, requests=n or (None if dur else base.requests), duration_s=dur or base.duration_s)
    if spec.kind == "prompt":
        return replace(base, concurrency=1, rate_rps=None, requests=n or (None if dur else 8), duration_s=dur)
    if spec.kind == "concurrency":
        c = int(value)
        return replace(base, concurrency=c, rate_rps=None, requests=n or (None if dur else max(16, 4 * c)),
                       duration_s=dur)
    cap = base.concurrency if user_set_concurrency else 256
    return replace(base, concurrency=cap, rate_rps=float(value),
                   requests=n or (None if dur else max(16, int(value * 10))), duration_s=dur)


def stop_reason(spec: SweepSpec, value: float, metrics: dict[str, Any], too_long: str | None = None) -> str | None:
    """Why the sweep should stop after this point (None = go on). ``too_long``: a prompt
    point's refusal as longer than the server's context, in one line (it ends a prompt sweep)."""
    if spec.kind == "prompt" and too_long:
        return too_long
    req = metrics["requests"]
    if req["total"] and req["ok"] == 0:
        first = next(iter(metrics["errors"]), "error")
        return f"{label(spec.kind, value)}: every request failed ({first})"
    if spec.kind == "prompt":
        return None
    if req["errors"]:
        kinds = ", ".join(f"{k} {v['count']}" for k, v in metrics["errors"].items())
        return f"{label(spec.kind, value)}: errors appeared ({kinds})"
    slo = metrics.get("slo")
    if slo and not slo["all_met"]:
        broken = [k for k, v in slo["items"].items() if v["met"] is False]
        return f"{label(spec.kind, value)}: SLO broken ({', '.join(broken)})"
    if spec.kind == "rate":
        wait_p90 = metrics["slot_wait_s"]["p90"]
        if wait_p90 is not None and wait_p90 > 1.0:
            return (f"{label(spec.kind, value)}: requests waited for a client slot (p90 {wait_p90:.2f} s): "
                    "the server no longer keeps up with the offered rate")
    return None
