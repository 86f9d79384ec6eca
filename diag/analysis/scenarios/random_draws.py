"""Random scenario draws: parameters nobody tuned thresholds to, with ground truth from the injection.

A draw is a pure function of ``(seed, index)``: :func:`draw` returns a :class:`Draw` whose
parameters are in **calibration units** (prompt tokens, decode steps, multiples of the
measured prefill ms/token, of the short-prompt TTFT, of one stream's capacity), so a draw
means the same on a faster machine; :mod:`diag.analysis.scenarios.random_plans` turns it into the
catalogue's :class:`~diag.analysis.scenarios.catalog.Plan` for a calibration, and the one runner runs it.

Each draw picks a **family** (every category of the catalogue, ``healthy`` included) and a
**kind**: ``plain`` (the family's cause, at a magnitude drawn around the catalogue's), ``mix``
(the family's cause dominant over a second, weaker injected cause) or ``near-miss`` (the
family's cause injected too weakly to matter: ground truth ``healthy``). The ground truth is
written here, at draw time, from what is injected and how strongly; no rule is read.

How the ranges were chosen (the catalogue's value is the centre; ``logU`` = log-uniform):

- **Cause magnitudes** span about 0.6x..3x the catalogue's calibrated value (logU): the low
  end is the weakest that still is, by construction, the largest cost in TTFT (a tokenizer at
  >= 1.8 prefill-costs per token, a network delay >= 12 decode steps, a collective link adding
  >= 0.7 prefill-times per all-reduce pair); the high end stops where a draw would outlast its
  CI share. Near-miss magnitudes sit 10x or more below the plain range (a tokenizer at
  0.03-0.15 prefill-costs per token, a network delay of 0.05-0.3 decode steps, a KV budget
  for more sequences than ever run, a start-up before the server listens, chunked prefill, a
  front end with at least as many HTTP workers as the client has streams).
- **Mixes**: the second cause is drawn at 5-25% of the dominant one's mean TTFT cost per
  measured request (a cold start's load delay spread over the run's requests: it reaches the
  first ones only), so the dominant cause explains >= 4x the other's share; where the engine
  accounts both in stages, its accounting decides each run (:mod:`diag.analysis.scenarios.random_truth`).
- **Lengths**: prompts logU over 16..384 tokens (long-prompt families 512..1536), outputs
  4..96, spread 0 (fixed) or uniform +-10..60% (a prefill or network draw at one load level:
  at least +-25%, see :func:`one_level_spread`); every prompt + output fits the engine's
  2048-token context on any calibration (the tiny model's own cap).
- **Load**: concurrency 1..8 (decode 16..28, under the engine's 32-sequence cap); open-loop
  rates as a share of one stream's capacity (0.2..0.7 healthy; 1.5..3x the admitted
  capacity for a queue); request counts 6..54, sized so 12 draws x 2 modes run in minutes.
- **Added families** (:data:`ADDED_FAMILIES`, each on a key of its own: :func:`added_family`):
  ``engine_overhead``, a step loop that sleeps 1.5..5 decode steps (logU) before every step
  (``--inject scheduler_stall_ms``) at 2..6 streams, prompts of at most 128 tokens so the wait is
  a material share of TTFT; its near-miss 0.03..0.1 of a step.
- **Engine and probe**: policy (prefill-first / decode-first / chunked with a chunk of
  0.5..4 decode steps of prefill), TP 2 (the tiny model's 2 KV heads allow no more), PP 2..3
  (pipeline_bubble: concurrency 1 under a prompt sweep; no near-miss, see ``_plain``), KV
  block size 8/16/32, warm-up 1..3 requests (0 for cold start, whose users are the first
  requests), and the probe design: a sweep, one closed-loop level, or one open-loop level,
  where the family's cause is identifiable from the client side under that design.
- **The near-miss space** (:func:`near_miss_draw`, ``ttft scenarios check --near-miss M``): draws
  that are all near-misses, the family cycling through :data:`NEAR_MISS_SPACE` from a per-seed
  start (so M >= its length draws every family once), keyed apart from :func:`draw` so that no
  draw of the main space changed when it was added. It holds every near-miss above and three
  whose mechanism is present at full strength but is not the cause (truth ``healthy``):

  - ``head_of_line``: the plain family's chunked prefill and ``--inject-long`` prompts, at
    concurrency 1 (closed loop): each long prompt runs alone, no short request is ever behind
    an unfinished one, so its TTFT is its own prefill.
  - ``keepalive`` (the near-miss of ``failures``): a default engine whose HTTP server closes a
    connection idle for 0.3..1.2 s (``ttft serve --keepalive-timeout``; uvicorn and cpp-httplib
    close at 5 s), probed open-loop at a mean gap of 1.2..2x that (Poisson arrivals, so gaps fall
    on both sides of it, below the probe's own 4 s pool limit): connections go away between
    requests and a request may meet one closing; the probe reconnects (or retries once) and no
    request fails. Wall-clock seconds, not calibration units: the timeout is the server's.
  - ``prefill_compute`` ("light load on long prompts"): prompts as long as prompt work stays
    modest: the prompt's prefill at the calibrated ms/token lasts 1.0..2.5 decode steps (capped
    by the context), under half the 6 decode steps of the median request's prompt work that the
    verdict contract needs before prompt work is a cause (docs/verdict.md, "Prompt work counts as
    a cause only when ..."): healthy, not prefill_compute, with a 2x margin for the forward pass's
    fixed cost and timing noise (a prompt past 12 steps is the plain family's truth). One
    closed-loop stream, open-loop arrivals at 0.2..0.5 of one stream's capacity, or a prompt
    sweep at concurrency 1 up to that length; prompts vary so a client sees the slope.

  Half of the near-miss space's draws give no SLO (``slo_given``): then ``healthy`` must come
  from the own-work floor (nothing waits), not from targets met; ``decode`` and ``interference``
  keep theirs (:data:`SLO_NEAR_MISS`: their near-miss is the target met). Without an SLO the
  truth is ``healthy`` only while no cause is there by the contract, so such a draw's median
  prompt is capped at the light-load near-miss's 2.5 decode steps of prefill (the plan does it,
  on the calibration: :func:`prompt_capped`); not the shared-prefix
  design nor the long-prompt one.
- **SLOs** (the users' targets): 1..3x a generous base (5x the worst lone-request TTFT at
  that concurrency; 3 + concurrency decode steps per token), so ``healthy`` draws keep 2x
  of headroom; a decode draw's per-token target 1.2..1.8 lone-stream steps. Where a run
  designed healthy breaks its users' TTFT/TPOT target anyway (chunked prefill under open-loop
  arrivals can stall streams), that run is void, not scored (:mod:`diag.analysis.scenarios.random_truth`).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from typing import Any

#: every category of the catalogue (the families a draw picks from, uniformly)
FAMILIES: tuple[str, ...] = ("healthy", "queue", "tokenize", "prefill_compute", "kv_cache", "comm", "decode",
                             "interference", "cold_start", "network", "loadgen",
                             "frontend", "pipeline_bubble",  # from real incidents
                             "prefix_cache",
                             "head_of_line", "kv_reservation")
#: families added after draws of the others were measured: a draw becomes one of these on a key of
#: its own (:func:`added_family`), with the chance a uniform pick over all families would give, so
#: every other draw of every seed stays what it was
ADDED_FAMILIES: tuple[str, ...] = ("engine_overhead", "grammar_compile", "pd_transfer", "lora_adapters")
#: every family a main-space draw can have
ALL_FAMILIES: tuple[str, ...] = FAMILIES + ADDED_FAMILIES
KINDS = ("plain", "mix", "near-miss")
#: the second cause of a mix, per dominant family
MIX_SECOND: dict[str, tuple[str, ...]] = {
    "queue": ("tokenize", "network"), "tokenize": ("network",), "prefill_compute": ("network", "tokenize"),
    "network": ("tokenize",), "decode": ("tokenize",), "cold_start": ("network",),
    "frontend": ("network",),
    "pipeline_bubble": ("network",),
    "prefix_cache": ("network",),
}
#: families with a too-weak variant (ground truth healthy)
NEAR_MISS: tuple[str, ...] = ("queue", "tokenize", "kv_cache", "decode", "interference", "cold_start", "network",
                               "frontend", "prefix_cache", "kv_reservation", *ADDED_FAMILIES)
#: near-misses only in the near-miss space: the mechanism at full strength, not the cause (module docstring)
NEAR_MISS_EXTRA: tuple[str, ...] = ("head_of_line", "keepalive", "prefill_compute")
#: the near-miss space's families, cycled by index (:func:`near_miss_draw`)
NEAR_MISS_SPACE: tuple[str, ...] = tuple(f for f in NEAR_MISS if f not in ADDED_FAMILIES) + NEAR_MISS_EXTRA
#: the two spaces of draws: :func:`draw` and :func:`near_miss_draw`
SPACES: tuple[str, ...] = ("main", "near-miss")
#: near-misses defined by the users' target they meet: always with their SLO (without one, the
#: interference mix's short prompts wait behind the long ones' chunks: head_of_line, not healthy)
SLO_NEAR_MISS: tuple[str, ...] = ("decode", "interference")
#: light-load-on-long-prompts near-miss: the prompt's prefill in decode steps (logU); docs/verdict.md's
#: bar for prompt work as a cause is 6, and the top of this range stays under half of it
LIGHT_PROMPT_STEPS: tuple[float, float] = (1.0, 2.5)
#: keepalive near-miss: the server's idle keep-alive timeout (s, logU) and the mean arrival gap as a multiple of it
KEEPALIVE_S: tuple[float, float] = (0.3, 1.2)
KEEPALIVE_GAP_X: tuple[float, float] = (1.2, 2.0)


@dataclass(frozen=True)
class Draw:
    """One random scenario: its family, kind, ground truth and parameters (calibration units)."""

    seed: int
    index: int
    family: str
    kind: str
    expected: str  # the ground truth: the category a correct verdict names
    params: dict[str, Any] = field(default_factory=dict)
    space: str = "main"  # "main" (:func:`draw`) or "near-miss" (:func:`near_miss_draw`)

    @property
    def name(self) -> str:
        return (f"{'n' if self.space == 'near-miss' else 'r'}{self.index:03d}-{self.family}"
                + ("" if self.kind == "plain" else f"-{self.kind}"))

    def describe(self) -> str:
        p = self.params
        faults = ", ".join(f"{k}={v:.3g}" for k, v in sorted(p.get("faults", {}).items()))
        design = f"sweep {p['sweep']} {p['sweep_values']}" if p["design"] == "sweep" else p["design"]
        inp = f"{p['light_steps']:.2g} steps of prefill" if "light_steps" in p else str(p["input_tokens"])
        return (f"{self.family} ({self.kind}) design={design} c={p['concurrency']} in={inp}"
                f"±{p['input_spread']:.0%} out={p['output_tokens']} policy={p['policy']}"
                + (f" faults: {faults}" if faults else "")
                + (f" + {p['mix_second']} at {p['mix_share']:.0%} of its cost" if self.kind == "mix" else "")
                + (f" long every {p['long_every']} ({p['long_steps']:.0f} steps)" if "long_steps" in p else "")
                + (f" response_format {p['response_format']} ({p.get('schema_properties', 24)} fields)"
                   if "response_format" in p else "")
                + (f" keep-alive {p['keepalive_s']:.2f} s, mean gap {p['keepalive_s'] * p['gap_x']:.2f} s"
                   if "keepalive_s" in p else "")
                + ("" if p.get("slo_given", True) else " no SLO")
                + (f" (prompt <= {LIGHT_PROMPT_STEPS[1]:g} steps of prefill)" if prompt_capped(self) and "light_steps" not in p
                   else ""))


def prompt_capped(d: Draw) -> bool:
    """Whether ``d`` is a near-miss with no SLO whose median prompt the plan caps at
    ``LIGHT_PROMPT_STEPS[1]`` decode steps of prefill: without a target met, ``healthy`` holds only
    while no cause is there by the verdict contract, and prompt work of 6 decode steps or more is
    one (docs/verdict.md). Not the shared-prefix design (its long prompts are its own first uses,
    healthy by the contract when the cache spares the repeats) nor the long-prompt one (its median
    request is a short prompt)."""
    return (d.kind == "near-miss" and not d.params.get("slo_given", True)
            and d.params["design"] != "prefix" and "long_steps" not in d.params)


def added_family(space: str, seed: int, index: int, n_before: int) -> str | None:
    """One of :data:`ADDED_FAMILIES` for draw ``index`` of ``seed`` in ``space``, or None (the draw
    keeps its family). The k-th added family (from 0) takes a draw with the chance 1 / (``n_before``
    + k + 1) on a key of its own, the latest first, so each ends with the chance 1 / (``n_before`` +
    added) and adding one changed only the draws it took."""
    for k in reversed(range(len(ADDED_FAMILIES))):
        tag = "" if k == 0 else f"{ADDED_FAMILIES[k]}:"  # the first family's key is the one it always had
        x = random.Random(f"ttft-random-added:{tag}{space}:{seed}:{index}").random() * (n_before + k + 1)
        if x >= n_before + k:
            return ADDED_FAMILIES[k]
    return None


def _rng(seed: int, index: int) -> random.Random:
    return random.Random(f"ttft-random:{seed}:{index}")  # str seeds hash stably across runs


def _logu(r: random.Random, lo: float, hi: float) -> float:
    return math.exp(r.uniform(math.log(lo), math.log(hi)))


def _base(r: random.Random) -> dict[str, Any]:
    """What every draw has: lengths and spread, probe design, policy, warm-up, SLO headroom."""
    policy = r.choice(("prefill-first", "prefill-first", "decode-first", "chunked"))
    return {"input_tokens": int(_logu(r, 16, 384)), "input_spread": r.choice((0.0, 0.0, r.uniform(0.1, 0.6))),
            "output_tokens": r.randint(8, 48), "output_spread": r.choice((0.0, r.uniform(0.1, 0.5))),
            "concurrency": r.randint(1, 4), "design": r.choice(("closed", "open", "sweep")),
            "load": r.uniform(0.2, 0.7), "requests": r.randint(16, 32), "warmup": r.randint(1, 3),
            "policy": policy, "chunk_steps": r.uniform(0.5, 4.0), "slo_headroom": r.uniform(1.0, 3.0),
            "tpot_headroom": r.uniform(1.2, 2.5), "sweep": "concurrency", "sweep_values": [],
            "requests_per_point": r.randint(6, 10), "faults": {}}


def _open_cap(p: dict[str, Any]) -> None:
    """An open loop's in-flight cap stays above what its arrivals need (>= 4): arrivals never
    wait in the client for a free slot, only in the server (what a queue draw injects)."""
    if p["design"] == "open":
        p["concurrency"] = max(p["concurrency"], 4)


def one_level_spread(p: dict[str, Any], spread: float = 0.25) -> None:
    """A prompt-length family (prefill, network) at one load level gets prompts that vary (at
    least +-25%, else ``spread``): with one fixed length at one level, nothing in client timing
    tells prompt work from a fixed delay, and the client-only verdict is rightly inconclusive."""
    if p["design"] != "sweep" and p["input_spread"] < 0.25:
        p["input_spread"] = spread


def _plain(family: str, r: random.Random, p: dict[str, Any]) -> None:
    """The family's cause at a magnitude around the catalogue's (see the module docstring)."""
    f = p["faults"]
    if family == "healthy":
        if p["design"] == "sweep":
            p["sweep_values"] = sorted({1, r.randint(2, 3), 4})[: r.randint(2, 3)]
        p["input_tokens"] = min(p["input_tokens"], 256)
    elif family == "queue":
        m = r.choice((1, 1, 2))
        p.update(max_running=m, concurrency=m * r.randint(3, 6), load=r.uniform(1.5, 3.0),
                 input_tokens=min(p["input_tokens"], 128), output_tokens=r.randint(16, 48))
        p["design"] = r.choice(("closed", "open", "sweep", "sweep"))
        p["sweep"] = r.choice(("concurrency", "rate"))
        p["sweep_values"] = ([m, 2 * m, 4 * m, r.randint(6, 8) * m] if p["sweep"] == "concurrency"
                             else [round(x, 2) for x in (0.5, 1.0, r.uniform(1.8, 2.5), r.uniform(3.0, 4.0))])
    elif family == "tokenize":
        f["tokenize_x"] = _logu(r, 0.6, 3.0)  # x the catalogue's max(3 prefill-costs, one step) per token
        p.update(concurrency=r.randint(1, 2), design=r.choice(("sweep", "closed")), sweep="prompt")
        lo = r.choice((16, 24, 32))
        p["sweep_values"] = [lo * 2**k for k in range(r.randint(3, 4))]
        p.update(input_tokens=r.randint(96, 256), input_spread=r.uniform(0.5, 0.8))  # closed: a slope within one level
    elif family == "prefill_compute":
        p.update(concurrency=1, design=r.choice(("sweep", "closed")), sweep="prompt", output_tokens=r.randint(4, 12),
                 input_tokens=r.randint(640, 1536), input_spread=r.choice((0.0, r.uniform(0.1, 0.3))),
                 requests=r.randint(8, 12), requests_per_point=r.randint(3, 5))
        lo, hi = r.randint(48, 96), r.randint(768, 1536)
        p["sweep_values"] = sorted({int(lo * 2**k) for k in range(8) if lo * 2**k < hi} | {hi})
        one_level_spread(p)
    elif family == "kv_cache":
        fits = r.randint(2, 4)
        p.update(kv_fits=fits, block_size=r.choice((8, 16, 32)), input_tokens=r.randint(128, 384), input_spread=0.0,
                 output_tokens=r.randint(32, 64), output_spread=0.0, design=r.choice(("sweep", "closed")),
                 concurrency=min(16, fits * r.randint(3, 4)), sweep="concurrency")
        p["sweep_values"] = sorted({1, fits, 2 * fits, min(16, 4 * fits)})
        p["requests"] = 3 * p["concurrency"]
    elif family == "comm":
        f["collective_x"] = _logu(r, 0.7, 3.0)  # x the catalogue's prefill/(2 layers) per all-reduce
        p.update(tp=2, concurrency=r.randint(1, 2), design="closed", input_tokens=r.randint(128, 512),
                 output_tokens=r.randint(4, 8), requests=r.randint(4, 8), input_spread=0.0)
    elif family == "decode":
        p.update(concurrency=r.randint(16, 28), design="closed", input_tokens=r.randint(8, 32),
                 output_tokens=r.randint(48, 96), tpot_steps=r.uniform(1.2, 1.8), policy=r.choice(("prefill-first", "decode-first")))
        p["requests"] = 2 * p["concurrency"]
    elif family == "interference":
        p.update(policy="prefill-first", design="closed", concurrency=r.randint(3, 5), stall_steps=r.uniform(48, 96),
                 itl_steps=r.uniform(24, 36), requests=r.randint(36, 54), streams=r.randint(1, 3))
    elif family == "cold_start":
        f["load_delay_x"] = r.uniform(0.7, 2.0)  # x the catalogue's max(2 s, 100 short-prompt TTFTs)
        p.update(lazy_load=True, warmup=0, concurrency=r.randint(1, 2), design=r.choice(("closed", "open")),
                 requests=r.randint(8, 16), input_tokens=r.randint(16, 64), output_tokens=r.randint(4, 16))
    elif family == "network":
        f["network_x"] = _logu(r, 0.6, 3.0)  # x the catalogue's max(20 ms, 5 short TTFTs, 60 steps)
        p.update(sweep="prompt", concurrency=min(p["concurrency"], 3), input_tokens=min(p["input_tokens"], 256))
        p["sweep_values"] = [32 * 2**k for k in range(r.randint(2, 4))]
        one_level_spread(p, 0.5)
    elif family == "frontend":
        # a front end of w HTTP workers (+ w tokenizer threads) under w x 3..5 streams: requests wait
        # before the engine for a whole stream ahead (llama.cpp --threads-http below its slots)
        w = r.choice((1, 1, 2))
        f["frontend_workers"] = w
        p.update(concurrency=w * r.randint(3, 5), design=r.choice(("sweep", "sweep", "closed")), sweep="concurrency",
                 input_tokens=min(p["input_tokens"], 128), output_tokens=r.randint(16, 48))
        p["sweep_values"] = [w, 2 * w, 4 * w, r.randint(5, 6) * w]
    elif family == "pipeline_bubble":
        # PP 2..3 at concurrency 1: one sequence per step, one micro-batch, each stage idles while
        # the others run ((N-1)/N of stage time). Server-side only: a client sees prompt-proportional
        # TTFT (prefill_compute, random_truth.CLIENT_ONLY_ALSO). No near-miss yet: the one PP load
        # measured under the rule's 20% (8 micro-batches of 8 simultaneous 256-token prompts: 16% idle
        # on 2 cores) is a prefill_compute run, not a healthy one; a healthy PP load is still to design
        # A prompt sweep: the client-only half then has the prompt slope to name (one level at 8-12
        # requests read as healthy from the client, which cannot see stages at all)
        p.update(pp=r.choice((2, 2, 3)), concurrency=1, design="sweep", sweep="prompt", input_tokens=r.randint(128, 512),
                 input_spread=0.0, output_tokens=r.randint(4, 12), requests_per_point=r.randint(4, 6))
        lo = r.randint(48, 96)
        p["sweep_values"] = [lo * 2**k for k in range(4)]
    elif family == "prefix_cache":
        # the probe's --shared-prefix N:R design at concurrency 1 against an engine whose prefix cache
        # is off: a prefix whose prefill costs 5..15 short-prompt TTFTs, R uses of it, one control
        p.update(design="prefix", concurrency=1, prefix_x=_logu(r, 5.0, 15.0), prefix_repeats=r.randint(2, 4),
                 input_tokens=r.randint(16, 96), input_spread=0.0, output_tokens=r.randint(4, 12), output_spread=0.0,
                 prefix_groups=r.randint(4, 6))
        p["requests"] = p["prefix_groups"] * (p["prefix_repeats"] + 1)
    elif family == "head_of_line":
        # chunked prefill of 16..48-token chunks with no cap on partial prefills, and the probe's
        # --inject-long design: every 4..8th prompt lasts 45..100 decode steps of prefill among short
        # ones, which wait for its whole prefill. No near-miss here: the cap splits the chunk, so the
        # long prompts' own TTFT grows and a users' target decides (the fixed tests hold the near-miss)
        p.update(policy="chunked", hol_chunk=r.choice((16, 32, 48)), concurrency=r.randint(3, 5), design="closed",
                 input_tokens=r.randint(8, 24), input_spread=0.0, output_tokens=r.randint(4, 12), output_spread=0.0,
                 long_steps=r.uniform(45, 100), long_every=r.randint(4, 8), requests=r.randint(36, 54))
    elif family == "kv_reservation":
        # --kv-admission reserve and requests without max_tokens: each reserves the 512-token context,
        # a KV budget of 2..3 contexts runs that many of 3..4x as many streams while KV usage stays low
        fits = r.randint(2, 3)
        p.update(kv_admission="reserve", omit_max_tokens=True, reserve_fits=fits, concurrency=fits * r.randint(3, 4),
                 design="closed", input_tokens=r.randint(16, 64), input_spread=0.0, output_tokens=16, output_spread=0.0)
        p["requests"] = 4 * p["concurrency"]
    elif family == "engine_overhead":
        # a CPU-bound step loop: it sleeps 1.5..5 decode steps before every step (--inject
        # scheduler_stall_ms), so the device idles 60-85% of the time requests are inside the engine
        # and each TTFT waits about one such gap; short prompts keep the gap a material share of it
        f["stall_steps"] = _logu(r, 1.5, 5.0)
        p.update(concurrency=r.randint(2, 6), design=r.choice(("closed", "open")), input_tokens=min(p["input_tokens"], 128),
                 output_tokens=r.randint(8, 32), requests=r.randint(24, 40))
    elif family == "grammar_compile":
        # the probe's --response-format schema:R design: a fresh generated schema of 20..60 fields
        # every R requests, R above twice the streams so repeats follow answered first uses; each
        # first use waits for its grammar (tens of short-prompt TTFTs of compile on 2 cores)
        c = r.randint(1, 3)
        group = r.randint(2 * c + 2, 2 * c + 5)
        p.update(concurrency=c, design=r.choice(("closed", "open")), input_tokens=min(p["input_tokens"], 192),
                 output_tokens=r.randint(8, 32), schema_properties=int(_logu(r, 20, 60)),
                 response_format=f"schema:{group}", requests=group * r.randint(3, 5))
    elif family == "pd_transfer":
        # disaggregated prefill/decode (--pd) whose link adds 2.5..8 short-prompt TTFTs to every KV
        # transfer (--inject kv_transfer_latency_ms); not chunked (the prefill side's policy is its own)
        f["transfer_x"] = _logu(r, 2.5, 8.0)
        p.update(pd=True, policy=r.choice(("prefill-first", "decode-first")), concurrency=r.randint(1, 3),
                 design=r.choice(("closed", "open")), input_tokens=min(p["input_tokens"], 256),
                 output_tokens=r.randint(8, 32), requests=r.randint(24, 40))
    elif family == "lora_adapters":
        # 3..4 LoRA adapters in one slot (--lora-modules, --max-loras 1) under 3..5 streams, the probe's
        # --lora (one adapter, then all of them at the same load): a request for an adapter not
        # running waits for its turn
        n = r.randint(3, 4)
        p.update(lora_adapters=n, max_loras=1, concurrency=r.randint(3, 5), design="closed", policy="prefill-first",
                 input_tokens=min(p["input_tokens"], 128), input_spread=0.0, output_tokens=r.randint(16, 32),
                 output_spread=0.0, requests=r.randint(24, 32))
    elif family == "loadgen":
        p.update(starve_client=True, concurrency=r.randint(3, 8), design=r.choice(("closed", "open")),
                 requests=r.randint(30, 48), input_tokens=r.randint(16, 64), output_tokens=r.randint(8, 24),
                 load=r.uniform(0.5, 1.0))


def _mix(family: str, r: random.Random, p: dict[str, Any]) -> str:
    """Add a second, weaker cause (5-25% of the dominant one's TTFT cost); returns its name."""
    second = r.choice(MIX_SECOND[family])
    p["mix_share"] = r.uniform(0.05, 0.25)
    p["mix_second"] = second
    return second


def _near_miss(family: str, r: random.Random, p: dict[str, Any]) -> None:
    """The family's cause, too weak to matter: ground truth healthy (see the module docstring)."""
    f = p["faults"]
    streams = p["concurrency"]
    p.update(design=r.choice(("closed", "open")), concurrency=r.randint(1, 4), input_tokens=min(p["input_tokens"], 256))
    _open_cap(p)
    if family == "queue":
        p["max_running"] = p["concurrency"] + r.randint(0, 2)  # the cap never binds
    elif family == "tokenize":
        f.clear()
        f["tokenize_pf"] = r.uniform(0.03, 0.15)  # prefill-costs per token
    elif family == "kv_cache":
        p.update(kv_fits=p["concurrency"] + r.randint(2, 4), block_size=r.choice((8, 16, 32)),
                 input_spread=0.0, output_spread=0.0)
    elif family == "decode":
        p.update(design="closed", concurrency=streams, tpot_steps=r.uniform(15, 25))  # many streams, a target they meet
    elif family == "interference":
        p.update(policy="chunked", design="closed", concurrency=streams, chunk_steps=r.uniform(0.7, 1.5))
    elif family == "cold_start":
        f.clear()
        f["load_delay_x"] = r.uniform(0.5, 1.5)  # loaded before the server listens: users never meet it
        p.update(lazy_load=False, warmup=r.randint(0, 2))
    elif family == "network":
        f.clear()
        f["network_steps"] = r.uniform(0.05, 0.3)
    elif family == "frontend":
        f.clear()
        f["frontend_workers"] = p["concurrency"] + r.randint(0, 2)  # the pool never binds
    elif family == "prefix_cache":
        p.update(design="prefix", concurrency=1, prefix_caching=True)  # the same design, the cache on: repeats hit
    elif family == "engine_overhead":
        f.clear()
        f["stall_steps"] = r.uniform(0.03, 0.1)  # a loop whose own work is a few % of a step
    elif family == "lora_adapters":  # as many slots as adapters: they batch together
        n = r.randint(3, 4)
        p.update(lora_adapters=n, max_loras=n, concurrency=r.randint(3, 5), design="closed", policy="prefill-first",
                 input_spread=0.0, output_tokens=r.randint(16, 32), output_spread=0.0, requests=r.randint(24, 32))
    elif family == "pd_transfer":
        f.clear()  # the same disaggregated engine on its own link: a transfer of a few ms
        p.update(pd=True, policy=r.choice(("prefill-first", "decode-first")))
    elif family == "grammar_compile":
        p.update(response_format="schema:repeat")  # the same schema throughout: compiled in the warm-up, cached
    elif family == "kv_reservation":
        p["kv_admission"] = "on-demand"  # the same budget and requests, blocks taken as used: all run
    elif family == "head_of_line":  # the plain family's engine and long prompts, one request at a time
        p.update(design="closed", concurrency=1, requests=r.randint(24, 40))
    elif family == "keepalive":  # a default engine closing idle connections, arrivals on both sides of it
        p.update(design="open", keepalive_s=_logu(r, *KEEPALIVE_S), gap_x=r.uniform(*KEEPALIVE_GAP_X),
                 requests=r.randint(10, 14), warmup=1)
        _open_cap(p)
    elif family == "prefill_compute":  # light load on prompts as long as prompt work stays modest
        # not chunked: a chunk step per piece would stretch the prompt's own prefill past its steps
        p.update(light_steps=_logu(r, *LIGHT_PROMPT_STEPS), design=r.choice(("closed", "open", "sweep")),
                 policy=r.choice(("prefill-first", "decode-first")),
                 sweep="prompt", input_spread=r.uniform(0.25, 0.5), load=r.uniform(0.2, 0.5), requests=r.randint(12, 20),
                 requests_per_point=r.randint(4, 6), sweep_values=[0.25, 0.5, 0.75, 1.0])  # sweep: shares of the longest
        if p["design"] != "open":
            p["concurrency"] = 1
        _open_cap(p)


def draw(seed: int, index: int) -> Draw:
    """Draw ``index`` of ``seed``: a pure function of the two (no calibration, no rules)."""
    r = _rng(seed, index)
    family = added_family("main", seed, index, len(FAMILIES)) or r.choice(FAMILIES)
    p = _base(r)
    _plain(family, r, p)
    kinds = ["plain", "plain", "plain"] + (["mix"] if family in MIX_SECOND else []) + (["near-miss"] if family in NEAR_MISS else [])
    _open_cap(p)
    kind = "plain" if family == "healthy" else r.choice(kinds)
    if kind == "mix":
        _mix(family, r, p)
    elif kind == "near-miss":
        _near_miss(family, r, p)
    expected = "healthy" if kind == "near-miss" else family
    return Draw(seed, index, family, kind, expected, p)


def draws(seed: int, n: int) -> list[Draw]:
    return [draw(seed, i) for i in range(n)]


def near_miss_draw(seed: int, index: int) -> Draw:
    """Draw ``index`` of ``seed``'s near-miss space: a pure function of the two, keyed apart from
    :func:`draw`; the family is :data:`NEAR_MISS_SPACE` cycled from a start drawn per seed."""
    start = random.Random(f"ttft-random-near-miss:{seed}").randrange(len(NEAR_MISS_SPACE))
    family = (added_family("near-miss", seed, index, len(NEAR_MISS_SPACE))
              or NEAR_MISS_SPACE[(start + index) % len(NEAR_MISS_SPACE)])
    r = random.Random(f"ttft-random-near-miss:{seed}:{index}")
    p = _base(r)
    if family in FAMILIES:
        _plain(family, r, p)
    _open_cap(p)
    _near_miss(family, r, p)
    # half without an SLO, except where the near-miss is the users' target met (decode, interference)
    p["slo_given"] = r.random() < 0.5 or family in SLO_NEAR_MISS
    return Draw(seed, index, family, "near-miss", "healthy", p, space="near-miss")


def space_draw(space: str, seed: int, index: int) -> Draw:
    """Draw ``index`` of ``seed`` in ``space`` (one of :data:`SPACES`)."""
    if space not in SPACES:
        raise ValueError(f"unknown draw space {space!r}; known: {', '.join(SPACES)}")
    return near_miss_draw(seed, index) if space == "near-miss" else draw(seed, index)
