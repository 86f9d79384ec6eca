"""The view model's plain values: what each panel renders (str, float, lists only).

Built on a worker thread by :mod:`tui.model`, read by the widgets on the UI thread; never
mutated after the frame is handed over. Units: durations in seconds (``_s``), rates per second,
bytes, percentages in percent (``_pct``), ratios 0..1 (``_ratio``); timestamps Unix ns (``_ns``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import rules

@dataclass
class EvidenceVM:
    """An evidence row's cells as every renderer shows them (:mod:`diag.analysis.report.cells`)."""

    name: str
    value: str
    threshold: str
    meaning: str
    mark: str = ""  # "✓ crossed", "✗ not crossed" or "" (context row)


@dataclass
class FindingVM:
    title: str
    category: str
    confidence: float
    explained: str


@dataclass
class VerdictVM:
    title: str = "waiting for data…"
    category: str = ""
    rule_id: str = ""
    confidence: float = 0.0
    explained: str = ""
    evidence: list[EvidenceVM] = field(default_factory=list)
    next_checks: list[str] = field(default_factory=list)
    note: str = ""
    others: list[FindingVM] = field(default_factory=list)
    #: the leading candidate under the verdict (a cause below the verdict floor), as one line; "" when none
    leading: str = ""
    skipped: list[str] = field(default_factory=list)
    #: the rules failed (``note`` says why): no verdict
    failed: bool = False
    #: no verdict yet (the first rules run is under way)
    pending: bool = False
    #: the verdict is from an earlier window or data; a new one is being computed
    stale: bool = False
    #: how the rules' window differs from the frame's (a sampled window), or ""
    scope: str = ""
    rules_ms: float | None = None
    #: live views: wall-clock time of the data the verdict is over (HH:MM:SS)
    as_of: str = ""


@dataclass
class LatencyVM:
    requests: int = 0
    errors: int = 0
    #: requests refused as longer than the server's context at a designed experiment's limit (not errors)
    over_context: int = 0
    side: str = ""  # "client" when the client's TTFT is measured, else "server"
    ttft_p50_s: float | None = None
    ttft_p95_s: float | None = None
    ttft_p99_s: float | None = None
    itl_p50_s: float | None = None
    itl_p99_s: float | None = None
    tpot_p50_s: float | None = None
    ttft_spark: list[float] = field(default_factory=list)  # mean TTFT per bucket, s
    itl_spark: list[float] = field(default_factory=list)  # mean ITL p50 per bucket, s


@dataclass
class StageVM:
    stage: str
    mean_s: float
    share: float  # of TTFT, 0..1


@dataclass
class StagesVM:
    stages: list[StageVM] = field(default_factory=list)
    ttft_mean_s: float | None = None
    covered_share: float | None = None  # sum of shares (≈1 when every stage is traced)
    note: str = ""


@dataclass
class ThroughputVM:
    req_per_s: float | None = None
    input_tok_per_s: float | None = None
    output_tok_per_s: float | None = None
    running: float | None = None
    waiting: float | None = None
    waiting_spark: list[float] = field(default_factory=list)
    kv_usage_ratio: float | None = None
    kv_max_ratio: float | None = None
    kv_spark: list[float] = field(default_factory=list)
    preemptions: float | None = None
    source: str = ""  # where running/waiting/KV came from


@dataclass
class GpuVM:
    entity: str
    util_pct: float | None = None
    hbm_used_bytes: float | None = None
    hbm_total_bytes: float | None = None
    membw_pct: float | None = None
    membw_label: str = "mem bw"
    nvlink_bytes_per_s: float | None = None
    pcie_bytes_per_s: float | None = None
    util_spark: list[float] = field(default_factory=list)


@dataclass
class BusyVM:
    """The engine's busy timeline from its step spans (the CPU fallback of the GPU panel)."""

    steps: int = 0
    busy_pct: float | None = None
    steps_per_s: float | None = None
    mean_step_s: float | None = None
    prefill_step_pct: float | None = None
    busy_spark: list[float] = field(default_factory=list)  # busy % per bucket
    prefill_spark: list[float] = field(default_factory=list)  # prefill tokens per bucket


@dataclass
class SlowRowVM:
    trace_id: str
    request_id: str
    ttft_s: float | None
    top_stage: str
    top_stage_s: float | None
    input_tokens: float | None
    output_tokens: float | None
    offset_s: float  # since the window start
    error: str


@dataclass
class ViewModel:
    title: str = ""
    live: bool = False
    phase: str | None = None
    window_label: str | None = None  # how the header names the window (the demo's "this phase")
    window_ns: tuple[int, int] = (0, 0)
    extent_ns: tuple[int, int] = (0, 0)
    whole: bool = False
    generation: int = 0
    notes: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    verdict: VerdictVM = field(default_factory=VerdictVM)
    latency: LatencyVM = field(default_factory=LatencyVM)
    stages: StagesVM = field(default_factory=StagesVM)
    throughput: ThroughputVM = field(default_factory=ThroughputVM)
    gpus: list[GpuVM] = field(default_factory=list)
    gpu_note: str = ""
    busy: BusyVM = field(default_factory=BusyVM)
    slowest: list[SlowRowVM] = field(default_factory=list)
    #: time spent in this frame's parts, ms: rules, view, total
    timings_ms: dict[str, float] = field(default_factory=dict)
    diagnosis: rules.Diagnosis | None = None  # kept for the report key (not rendered)


@dataclass
class WaterfallRow:
    name: str
    depth: int
    start_s: float  # offset from the request's first span
    duration_s: float
    service: str


@dataclass
class WaterfallVM:
    trace_id: str
    title: str
    rows: list[WaterfallRow] = field(default_factory=list)
    total_s: float = 0.0
    first_token_s: float | None = None  # offset of the first token (TTFT boundary)
    token_offsets_s: list[float] = field(default_factory=list)
    facts: list[tuple[str, str]] = field(default_factory=list)
