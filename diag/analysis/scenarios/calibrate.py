"""A short calibration of this machine with the bundled engine, so that scenario loads and
sizes follow from measured speeds rather than constants tuned on one box.

Measured (tiny model, default engine, concurrency 1):
- ``ttft_short_ms``: TTFT of a short prompt (fixed overhead + a little prefill),
- ``prefill_ms_per_token``: the TTFT slope between a short and a long prompt,
- ``decode_step_ms``: the inter-token latency of one running sequence.

Each is the median of ``ROUNDS`` interleaved rounds, so that a few seconds of a noisy
neighbour do not set the sizes of every scenario after it. The engine runs as the scenarios
run it (:class:`EngineProcess`: all cores but one for torch).
"""

from __future__ import annotations

import json
import statistics
from dataclasses import asdict, dataclass
from pathlib import Path

from diag.analysis.scenarios.engine_process import EngineProcess

SHORT_TOKENS = 32
LONG_TOKENS = 512
ROUNDS = 3
NOISY_SPREAD = 1.5


@dataclass(frozen=True)
class Calibration:
    """Speeds of this machine for the tiny model (milliseconds)."""

    ttft_short_ms: float
    prefill_ms_per_token: float
    decode_step_ms: float
    device: str = "cpu"
    #: slowest / fastest round (short-prompt TTFT or decode step, whichever varied more): 1.0
    #: on a quiet machine; above :data:`NOISY_SPREAD` the machine was busy while it was measured
    spread: float = 1.0

    @property
    def noisy(self) -> bool:
        return self.spread > NOISY_SPREAD

    def to_dict(self) -> dict[str, float | str]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, float | str]) -> "Calibration":
        keys = ("ttft_short_ms", "prefill_ms_per_token", "decode_step_ms", "device", "spread")
        return cls(**{k: d[k] for k in keys if k in d})  # type: ignore[arg-type]


def _p50_ms(result: object, key: str) -> float:
    dist = result.metrics[key]  # type: ignore[attr-defined]
    if not dist.get("count"):
        raise RuntimeError(f"calibration: no {key} measured")
    return float(dist["p50"]) * 1e3


def calibrate(device: str = "cpu", cache: str | Path | None = None) -> Calibration:
    """Measure the machine (about 15 s on 2 CPU cores); reuse ``cache`` when it exists."""
    if cache is not None and Path(cache).exists():
        return Calibration.from_dict(json.loads(Path(cache).read_text()))
    from collectors.probe import LengthSpec, LoadSpec, ProbeConfig, WorkloadSpec, run_probe

    rounds: list[tuple[float, float, float]] = []
    with EngineProcess(["--device", device]) as eng:
        def measure(inp: int, out: int, n: int) -> object:
            cfg = ProbeConfig(eng.url, load=LoadSpec(concurrency=1, requests=n, warmup_requests=1),
                              workload=WorkloadSpec(LengthSpec("fixed", inp), LengthSpec("fixed", out)), output=None)
            return run_probe(cfg)

        for _ in range(ROUNDS):
            ttft_short = _p50_ms(measure(SHORT_TOKENS, 4, 6), "ttft_s")
            ttft_long = _p50_ms(measure(LONG_TOKENS, 4, 6), "ttft_s")
            rounds.append((ttft_short, (ttft_long - ttft_short) / (LONG_TOKENS - SHORT_TOKENS),
                           _p50_ms(measure(SHORT_TOKENS, 48, 3), "itl_s")))
    short, per_token, step = (statistics.median(r[i] for r in rounds) for i in range(3))
    spread = max(max(r[i] for r in rounds) / max(min(r[i] for r in rounds), 1e-9) for i in (0, 2))
    cal = Calibration(ttft_short_ms=short, prefill_ms_per_token=max(per_token, 1e-4), decode_step_ms=step,
                      device=device, spread=round(spread, 3))
    if cache is not None:
        Path(cache).parent.mkdir(parents=True, exist_ok=True)
        Path(cache).write_text(json.dumps(cal.to_dict(), indent=2))
    return cal
