"""The scenario catalog: one reproducible bottleneck per category, sized from a calibration.

A scenario is a plan of phases; each phase is one bundled-engine process (its ``ttft serve``
arguments) and the probe steps run against it. The ground truth of each scenario is written
down here, next to the cause it injects, so ``ttft scenarios check`` can score the verdicts.
Sizes come from :class:`~diag.analysis.scenarios.calibrate.Calibration` (measured prefill ms/token and
decode step), never from constants tuned on one machine.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from diag.analysis.scenarios.calibrate import Calibration


@dataclass(frozen=True)
class ProbeStep:
    """One probe (or sweep) against the phase's engine. Lengths in tokens."""

    concurrency: int = 1
    requests: int | None = None
    input_tokens: str = "fixed:64"
    output_tokens: str = "fixed:16"
    sweep: str | None = None  # "prompt" | "concurrency" | "rate"
    sweep_values: tuple[float, ...] = ()
    requests_per_point: int | None = None
    prompts: tuple[tuple[int, int], ...] = ()  # (input tokens, max tokens) cycled: a mixed workload
    warmup: int = 1
    segment: str | None = None
    starve_client: bool = False  # a CPU hog in the client's own process (loadgen scenario)
    rate_rps: float | None = None
    #: the probe's --shared-prefix N:R design as (N tokens, R uses per prefix); (0, 0): none
    shared_prefix: tuple[int, int] = (0, 0)
    #: the probe's --inject-long TOKENS:EVERY design; (0, 0): none
    inject_long: tuple[int, int] = (0, 0)
    #: send no max_tokens (the server's default applies)
    omit_max_tokens: bool = False
    #: the probe's --response-format design (e.g. "schema:6") and its generated schema's fields; None: plain text
    response_format: str | None = None
    schema_properties: int = 24
    #: the user's own JSON schema for that design (``--schema FILE``) instead of a generated one
    schema_file: str | None = None
    #: the probe's --lora design: adapter names, one drawn per request; (): none
    lora: tuple[str, ...] = ()


@dataclass(frozen=True)
class Phase:
    """One engine process and what the probe does against it."""

    serve_args: tuple[str, ...]
    steps: tuple[ProbeStep, ...]


@dataclass(frozen=True)
class Plan:
    phases: tuple[Phase, ...]
    slo: str | None = None  # the SLO the scenario's users hold (ttft_p99=..,tpot_p99=..)
    injected: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Scenario:
    """A named bottleneck with its ground truth and how to build it on this machine."""

    name: str
    category: str  # the verdict a correct diagnosis names
    cause: str  # what the scenario does to cause it (the ground truth, in words)
    build: Callable[[Calibration], Plan]
    fast: bool = True  # part of the default test run
    #: client-only verdicts also scored right where the client cannot see the cause (say why in ``cause``)
    client_only_also: frozenset[str] = frozenset()


def _ms(x: float) -> str:
    """Milliseconds as an SLO value (diag.ground.slo accepts plain decimals only)."""
    return f"{x:.2f}ms"


def _slo(cal: Calibration, ttft_ms: float, tpot_ms: float) -> str:
    return f"ttft_p99={_ms(ttft_ms)},tpot_p99={_ms(tpot_ms)}"


def _healthy(cal: Calibration) -> Plan:
    step = ProbeStep(concurrency=2, requests=24, input_tokens="fixed:32", output_tokens="fixed:16")
    # users' targets: TTFT well above a short prompt's own cost, TPOT a few single-stream steps
    return Plan((Phase((), (step,)),), slo=_slo(cal, 20 * cal.ttft_short_ms + 64 * cal.prefill_ms_per_token,
                                                   6 * cal.decode_step_ms))


#: the idle-keepalive scenario: the server closes a connection idle this long (s), and requests
#: arrive (Poisson) at a mean gap of 1.5x that, so gaps fall on both sides of it
IDLE_KEEPALIVE_S = 1.0


def _idle_keepalive(cal: Calibration) -> Plan:
    # a healthy engine whose HTTP server closes idle keep-alive connections (uvicorn and
    # cpp-httplib do at 5 s; here 1 s, below the probe's own 4 s pool limit) under sparse
    # open-loop arrivals: the probe meets connections the server closed, reconnects (or retries
    # a request that found its reused one closed, once), and no request fails
    step = ProbeStep(concurrency=4, requests=16, input_tokens="fixed:32", output_tokens="fixed:16",
                     rate_rps=round(1 / (1.5 * IDLE_KEEPALIVE_S), 3))
    return Plan((Phase(("--keepalive-timeout", f"{IDLE_KEEPALIVE_S:g}"), (step,)),),
                slo=_slo(cal, 20 * cal.ttft_short_ms + 64 * cal.prefill_ms_per_token, 6 * cal.decode_step_ms),
                injected={"keepalive_timeout_s": IDLE_KEEPALIVE_S})


def _queue(cal: Calibration) -> Plan:
    # the server admits one sequence at a time: arrivals above its capacity wait in the queue
    step = ProbeStep(sweep="concurrency", sweep_values=(1, 2, 4, 8), requests_per_point=8,
                     input_tokens="fixed:32", output_tokens="fixed:24")
    return Plan((Phase(("--max-running", "1"), (step,)),), injected={"max_running": 1})


def _tokenize(cal: Calibration) -> Plan:
    # a prompt token costs a whole decode step to tokenize: far above what a parallel prefill costs
    per_token_ms = max(3 * cal.prefill_ms_per_token, cal.decode_step_ms)
    step = ProbeStep(sweep="prompt", sweep_values=(32, 64, 128, 256), requests_per_point=4, output_tokens="fixed:8")
    return Plan((Phase(("--inject", f"tokenize_ms_per_token={per_token_ms:.3g}"), (step,)),),
                injected={"tokenize_ms_per_token": round(per_token_ms, 3)})


def _prefill(cal: Calibration) -> Plan:
    step = ProbeStep(sweep="prompt", sweep_values=(64, 128, 256, 512, 1024), requests_per_point=4, output_tokens="fixed:8")
    return Plan((Phase((), (step,)),))


def _kv_cache(cal: Calibration) -> Plan:
    inp, out, block = 256, 48, 16
    fits = 3  # sequences that fit in the KV budget
    blocks = fits * math.ceil((inp + out) / block)
    step = ProbeStep(sweep="concurrency", sweep_values=(1, 2, 3, 6, 12), requests_per_point=8,
                     input_tokens=f"fixed:{inp}", output_tokens=f"fixed:{out}")
    return Plan((Phase(("--kv-blocks", str(blocks), "--block-size", str(block)), (step,)),),
                injected={"kv_blocks": blocks})


def _comm(cal: Calibration) -> Plan:
    inp = 256
    layers = 4  # the tiny preset; two all-reduces per layer per forward
    per_allreduce_ms = max(1.0, inp * cal.prefill_ms_per_token / (2 * layers))
    step = ProbeStep(concurrency=1, requests=6, input_tokens=f"fixed:{inp}", output_tokens="fixed:4")
    return Plan(
        (
            Phase(("--tp", "1"), (ProbeStep(**{**step.__dict__, "segment": "tp=1"}),)),
            Phase(("--tp", "2", "--inject", f"collective_latency_ms={per_allreduce_ms:.3g}"),
                  (ProbeStep(**{**step.__dict__, "segment": "tp=2"}),)),
        ),
        injected={"collective_latency_ms": round(per_allreduce_ms, 3), "tp": [1, 2]},
    )


def _decode(cal: Calibration) -> Plan:
    # 24 streams (under the engine's 32-sequence cap, so none queues) decode at a fraction of a
    # single stream's speed (~5x slower per token on 2 CPU cores); the users' per-token target is
    # 1.5 single-stream steps: broken by a factor of 3 or more, the TTFT target generous
    step = ProbeStep(concurrency=24, requests=48, input_tokens="fixed:16", output_tokens="fixed:64")
    return Plan((Phase((), (step,)),), slo=_slo(cal, 80 * cal.ttft_short_ms + 256 * cal.prefill_ms_per_token,
                                                   1.5 * cal.decode_step_ms))


#: The interference pair's long prompts stall running streams for this many decode steps (the
#: longest; more in practice, attention being quadratic); its ITL target sits near the geometric
#: middle of that stall (~230 ms on 2 CPU cores) and chunked prefill's ITL p99 (~25 ms), a factor
#: of about 3 from each, so a calibration off by 2x either way still tells the two policies apart.
STALL_STEPS = 64
ITL_TARGET_STEPS = 30


def _longest_prompt(cal: Calibration) -> int:
    """Tokens whose prefill lasts ``STALL_STEPS`` decode steps (within the tiny model's context)."""
    return int(min(1792, max(384, STALL_STEPS * cal.decode_step_ms / cal.prefill_ms_per_token)))


def _mixed_prompts(cal: Calibration) -> tuple[tuple[int, int], ...]:
    """Short streams (16-token prompt, 32 tokens out) with long prompts arriving among them.

    Streams are short so that stalls are a few percent of all token gaps: the ITL p99 then
    lands on a stall whenever long prefills stall streams, and on a plain step when they do not.
    """
    longest = _longest_prompt(cal)
    stream = (16, 32)
    return (stream, stream, (3 * longest // 5, 4), stream, stream, (4 * longest // 5, 4), stream, stream,
            (longest, 4))


def _chunk_tokens(cal: Calibration) -> int:
    """A prefill chunk that costs about one decode step (a multiple of 16, 16..256 tokens).

    Smaller chunks do not help here: each chunk step also attends over the whole prompt so
    far, so halving the chunk nearly doubles the long prompts' TTFT and hardly shortens a step.
    """
    return int(min(256, max(16, 16 * round(cal.decode_step_ms / cal.prefill_ms_per_token / 16))))


def _interference_slo(cal: Calibration) -> str:
    """What the streaming users of this mix hold: a long prompt may take its prefill and wait
    behind others (the TTFT target is generous), but a running stream must not stall for more
    than ``ITL_TARGET_STEPS`` decode steps."""
    longest = _longest_prompt(cal)
    return (f"ttft_p99={_ms(16 * longest * cal.prefill_ms_per_token + 20 * cal.ttft_short_ms)},"
            f"itl_p99={_ms(ITL_TARGET_STEPS * cal.decode_step_ms)}")


def _interference(cal: Calibration) -> Plan:
    step = ProbeStep(concurrency=4, requests=45, prompts=_mixed_prompts(cal))
    return Plan((Phase(("--policy", "prefill-first"), (step,)),), slo=_interference_slo(cal))


def _interference_chunked(cal: Calibration) -> Plan:
    step = ProbeStep(concurrency=4, requests=45, prompts=_mixed_prompts(cal))
    chunk = _chunk_tokens(cal)
    return Plan((Phase(("--policy", "chunked", "--chunk-size", str(chunk)), (step,)),), slo=_interference_slo(cal),
                injected={"chunk_size_tokens": chunk})


def _cold_start(cal: Calibration) -> Plan:
    delay_s = max(2.0, 100 * cal.ttft_short_ms / 1e3)
    step = ProbeStep(concurrency=1, requests=12, input_tokens="fixed:32", output_tokens="fixed:8", warmup=0)
    # --lazy-load: the engine listens at once and loads behind it, so the probe's first request
    # arrives while the model is still loading
    return Plan((Phase(("--lazy-load", "--inject", f"load_delay_s={delay_s:.3g}"), (step,)),),
                injected={"load_delay_s": round(delay_s, 3)})


def _network(cal: Calibration) -> Plan:
    # a fixed latency of ~60 decode steps: the client-only rule needs 10 (a factor of 6 to spare
    # for a calibration off, or a token cadence slowed by the delayed stream)
    delay_ms = max(20.0, 5 * cal.ttft_short_ms, 60 * cal.decode_step_ms)
    step = ProbeStep(sweep="prompt", sweep_values=(32, 64, 128), requests_per_point=6, output_tokens="fixed:16")
    return Plan((Phase(("--inject", f"network_delay_ms={delay_ms:.3g}"), (step,)),),
                injected={"network_delay_ms": round(delay_ms, 3)})


def _pipeline_bubble(cal: Calibration) -> Plan:
    # PP 2 at concurrency 1: each step holds one sequence, so one micro-batch, and each of the two
    # stages idles while the other runs (about half the stage time). Server-side only: a client
    # sees prompt-proportional TTFT, which it names prefill_compute (Scenario.client_only_also)
    # prompts long enough that prompt work holds the first token back several decode steps (a PP decode
    # step is long), as prefill_compute needs ([prefill_compute] prompt_steps_min)
    step = ProbeStep(sweep="prompt", sweep_values=(128, 256, 512, 1024), requests_per_point=5, output_tokens="fixed:4")
    return Plan((Phase(("--pp", "2"), (step,)),), injected={"pp": 2, "concurrency": 1})


def _frontend(cal: Calibration) -> Plan:
    # two HTTP workers (llama.cpp --threads-http below its slots): past two streams, requests wait in
    # the front end for a whole stream ahead while the engine's queue stays empty. A client alone
    # sees TTFT climb with load as behind any one-at-a-time server: client-only names queue
    # (Scenario.client_only_also); the engine's /metrics or its spans tell the two apart
    step = ProbeStep(sweep="concurrency", sweep_values=(1, 2, 4, 8), requests_per_point=8,
                     input_tokens="fixed:32", output_tokens="fixed:16")
    return Plan((Phase(("--inject", "frontend_workers=2"), (step,)),), injected={"frontend_workers": 2})


def _prefix_tokens(cal: Calibration) -> int:
    """A shared prefix whose prefill costs about 8 short-prompt TTFTs (a multiple of 16, 256..1024 tokens)."""
    return int(min(1024, max(256, 16 * round(8 * cal.ttft_short_ms / cal.prefill_ms_per_token / 16))))


def _prefix_cache(cal: Calibration) -> Plan:
    # the engine's prefix cache is off (the default, as llama.cpp's chat endpoint ignoring
    # cache_prompt, ggml-org/llama.cpp#4329): every repeat of a shared prefix is prefilled again.
    # The probe's --shared-prefix N:3 design: a fresh prefix, two repeats, a control of the suffix alone
    n = _prefix_tokens(cal)
    step = ProbeStep(concurrency=1, requests=20, input_tokens=f"fixed:{n + 48}", output_tokens="fixed:4",
                     shared_prefix=(n, 3))
    return Plan((Phase((), (step,)),), injected={"prefix_caching": False, "shared_prefix_tokens": n})


def _head_of_line(cal: Calibration) -> Plan:
    # chunked prefill with no cap on partial prefills (vLLM before --max-num-partial-prefills,
    # vllm-project/vllm#10235): a long prompt's chunks take each step's chunk budget, so short
    # prompts arriving behind it wait for its whole prefill while KV and batch slots are free.
    # The probe's --inject-long design: every sixth prompt is long (client-only sees it too)
    longest = _longest_prompt(cal)
    step = ProbeStep(concurrency=4, requests=42, input_tokens="fixed:16", output_tokens="fixed:8",
                     inject_long=(min(900, longest), 6))
    return Plan((Phase(("--policy", "chunked", "--chunk-size", "32"), (step,)),),
                injected={"policy": "chunked", "chunk_size_tokens": 32, "max_partial_prefills": None})


def _kv_reservation(cal: Calibration) -> Plan:
    # --kv-admission reserve (TensorRT-LLM GUARANTEED_NO_EVICT) and requests without max_tokens:
    # each reserves the 512-token context (32 of 64 blocks), so two run of eight sent while the
    # blocks really used stay under 10% (NVIDIA/TensorRT-LLM#1012). A client alone sees a server
    # that admits two at a time, as a max_running cap would (Scenario.client_only_also: queue)
    step = ProbeStep(concurrency=8, requests=32, input_tokens="fixed:32", output_tokens="fixed:16",
                     omit_max_tokens=True)
    return Plan((Phase(("--kv-admission", "reserve", "--kv-blocks", "64", "--max-context", "512"), (step,)),),
                injected={"kv_admission": "reserve", "kv_blocks": 64, "max_tokens": None})


def _engine_overhead(cal: Calibration) -> Plan:
    # the step loop sleeps 3 decode steps before every step (a CPU-bound scheduler): the device idles
    # three quarters of the time requests are inside the engine, each TTFT waits about one such gap
    stall_ms = 3 * cal.decode_step_ms
    step = ProbeStep(concurrency=4, requests=40, input_tokens="fixed:64", output_tokens="fixed:16")
    return Plan((Phase(("--inject", f"scheduler_stall_ms={stall_ms:.3g}"), (step,)),),
                injected={"scheduler_stall_ms": round(stall_ms, 3)})


def _grammar_compile(cal: Calibration) -> Plan:
    # groups of six requests per fresh 30-field schema at two streams: each first use waits for its
    # grammar (tens of decode steps of compile on 2 cores), its five repeats find it cached
    step = ProbeStep(concurrency=2, requests=36, input_tokens="fixed:64", output_tokens="fixed:16",
                     response_format="schema:6", schema_properties=30)
    return Plan((Phase((), (step,)),), injected={"response_format": "schema:6", "schema_properties": 30})


def _pd_transfer(cal: Calibration) -> Plan:
    # disaggregated prefill/decode whose link adds 4 short-prompt TTFTs to every KV transfer: each
    # instance's own TTFT stays low, the user's holds the transfer
    ms = 4 * cal.ttft_short_ms
    step = ProbeStep(concurrency=2, requests=32, input_tokens="fixed:64", output_tokens="fixed:16")
    return Plan((Phase(("--pd", "--inject", f"kv_transfer_latency_ms={ms:.3g}"), (step,)),),
                injected={"pd": True, "kv_transfer_latency_ms": round(ms, 3)})


def _lora_adapters(cal: Calibration) -> Plan:
    # three adapters in one slot at four streams (the probe's --lora: one adapter, then all three):
    # a request for an adapter not running waits for the running ones' turn
    step = ProbeStep(concurrency=4, requests=32, input_tokens="fixed:64", output_tokens="fixed:24", lora=("a", "b", "c"))
    return Plan((Phase(("--lora-modules", "a", "b", "c", "--max-loras", "1"), (step,)),),
                injected={"lora_modules": ["a", "b", "c"], "max_loras": 1})


def _loadgen(cal: Calibration) -> Plan:
    step = ProbeStep(concurrency=4, requests=40, input_tokens="fixed:32", output_tokens="fixed:16", starve_client=True)
    return Plan((Phase((), (step,)),), injected={"client_cpu_hog": True})


SCENARIOS: tuple[Scenario, ...] = (
    Scenario("healthy", "healthy", "default engine, light load, SLOs with headroom", _healthy),
    Scenario("idle_keepalive", "healthy",
             "a healthy engine whose server closes connections idle 1 s (--keepalive-timeout 1), probed open-loop at "
             "a mean gap of 1.5 s: connections the server closed are the probe's to reopen, not failures",
             _idle_keepalive, fast=False),
    Scenario("queue", "queue", "the engine admits one sequence at a time (--max-running 1) under a concurrency sweep", _queue),
    Scenario("tokenize", "tokenize", "a slow tokenizer (tokenize_ms_per_token) under a prompt sweep", _tokenize),
    Scenario("prefill_compute", "prefill_compute", "long prompts: a prompt-length sweep at concurrency 1", _prefill),
    Scenario("kv_cache", "kv_cache", "a KV budget for 3 sequences (--kv-blocks) under a concurrency sweep", _kv_cache, fast=False),
    Scenario("comm", "comm", "TP 2 with a slow collective link (collective_latency_ms) against TP 1", _comm, fast=False),
    Scenario("decode", "decode", "24 concurrent long generations against a per-token SLO", _decode, fast=False),
    Scenario("interference", "interference",
             "prefill-first: long prompts arriving into running streams stall them past their ITL SLO", _interference,
             fast=False),
    Scenario("interference_chunked", "healthy",
             "the same workload and SLOs under chunked prefill (chunks of about one decode step): streams keep their cadence, the SLOs hold",
             _interference_chunked, fast=False),
    Scenario("cold_start", "cold_start", "first requests arrive while a slow model load (load_delay_s) is under way", _cold_start, fast=False),
    Scenario("network", "network", "a slow network: every SSE chunk delayed (network_delay_ms) after the engine", _network, fast=False),
    Scenario("loadgen", "loadgen", "a starved client: a CPU hog in the load generator's own process", _loadgen, fast=False),
    Scenario("frontend", "frontend",
             "two HTTP workers (--inject frontend_workers=2) under a concurrency sweep: requests wait before the engine "
             "while its queue stays empty; client-only it looks like an admission limit of two (named queue, or kv_cache's "
             "black-box knee: a client cannot tell a worker pool from a batch or KV cap)",
             _frontend, fast=False, client_only_also=frozenset({"queue", "kv_cache"})),
    Scenario("pipeline_bubble", "pipeline_bubble",
             "PP 2 (--pp 2) at concurrency 1 under a prompt sweep: one micro-batch per step, each stage idles while "
             "the other runs; server-side only (a client cannot see stages: client-only names prefill_compute)",
             _pipeline_bubble, fast=False, client_only_also=frozenset({"prefill_compute"})),
    Scenario("prefix_cache", "prefix_cache",
             "prompts repeat a shared prefix (the probe's --shared-prefix N:3) while the engine's prefix cache is off: "
             "every repeat prefills the whole prefix again, as a first use does", _prefix_cache, fast=False),
    Scenario("head_of_line", "head_of_line",
             "chunked prefill without a cap on partial prefills, every sixth prompt long (the probe's --inject-long): "
             "short prompts wait behind a long one's chunks while KV and batch slots are free", _head_of_line,
             fast=False),
    Scenario("engine_overhead", "engine_overhead",
             "a CPU-bound step loop (--inject scheduler_stall_ms, 3 decode steps before every step) at 4 streams: the "
             "device idles between steps while requests wait; server-side only (a client sees slower tokens and TTFT "
             "that a slower device would give too: client-only reads healthy)",
             _engine_overhead, fast=False, client_only_also=frozenset({"healthy"})),
    Scenario("kv_reservation", "kv_reservation",
             "--kv-admission reserve and requests without max_tokens: each reserves the whole context, two of eight "
             "run while KV usage stays low; client-only it looks like a two-request cap (named queue)",
             _kv_reservation, fast=False, client_only_also=frozenset({"queue"})),
    Scenario("grammar_compile", "grammar_compile",
             "structured output with a fresh 30-field JSON schema every six requests (the probe's --response-format "
             "schema:6) at 2 streams: each schema's first use waits for its grammar to compile, repeats hit the "
             "engine's grammar cache", _grammar_compile, fast=False),
    Scenario("lora_adapters", "lora_adapters",
             "three LoRA adapters in one slot (--lora-modules a b c --max-loras 1) at 4 streams, the probe's --lora "
             "a,b,c (one adapter, then all three): requests for an adapter not running wait for its turn",
             _lora_adapters, fast=False),
    Scenario("pd_transfer", "pd_transfer",
             "disaggregated prefill/decode (--pd) whose KV transfer takes 4 short-prompt TTFTs "
             "(--inject kv_transfer_latency_ms) at 2 streams: each side's own TTFT is low, the user's holds the "
             "transfer; server-side only (a client sees a latency it cannot place; one transfer at a time on the link "
             "makes a line it reads as queue; or, honestly, inconclusive with joining the server's spans first)",
             _pd_transfer, fast=False, client_only_also=frozenset({"healthy", "network", "queue", "inconclusive"})),
)


def get(name: str) -> Scenario:
    for s in SCENARIOS:
        if s.name == name:
            return s
    raise KeyError(f"unknown scenario {name!r}; known: {', '.join(s.name for s in SCENARIOS)}")
