"""A random draw as the catalogue's :class:`~diag.analysis.scenarios.catalog.Plan`, sized for a calibration.

:func:`build_plan` converts a :class:`~diag.analysis.scenarios.random_draws.Draw`'s parameters
(calibration units) into ``ttft serve`` arguments, probe steps and the users' SLOs, with the
catalogue's own sizing helpers where the catalogue has one (the interference mix, the chunk
of about one decode step). :func:`scenario` wraps a draw as a catalogue
:class:`~diag.analysis.scenarios.catalog.Scenario`, so the one runner runs it. Pure functions.
"""

from __future__ import annotations

import math
from typing import Any

from diag.analysis.scenarios.calibrate import Calibration
from diag.analysis.scenarios.catalog import Phase, Plan, ProbeStep, Scenario
from diag.analysis.scenarios.random_draws import LIGHT_PROMPT_STEPS, Draw, prompt_capped

#: the bundled engine's context (prompt + output tokens); a draw never asks for more
MAX_CONTEXT_TOKENS = 2048
#: kv_reservation draws: the context each request without max_tokens reserves
RESERVE_CONTEXT_TOKENS = 512
LAYERS = 4  # the tiny preset: two all-reduces per layer per forward


def length_spec(tokens: int, spread: float) -> str:
    """``fixed:N`` or ``uniform:LO-HI`` (+-spread around N)."""
    if spread <= 0:
        return f"fixed:{tokens}"
    lo, hi = max(1, int(tokens * (1 - spread))), max(1, int(math.ceil(tokens * (1 + spread))))
    return f"uniform:{lo}-{hi}"


def max_tokens(spec: str) -> int:
    return int(spec.split(":")[-1].split("-")[-1])


def service_ms(cal: Calibration, inp: int, out: int) -> float:
    """One lone request's time in the engine: its TTFT and its decode steps (ms)."""
    return cal.ttft_short_ms + inp * cal.prefill_ms_per_token + out * cal.decode_step_ms


def chunk_tokens(cal: Calibration, steps: float) -> int:
    """A prefill chunk that costs ``steps`` decode steps (a multiple of 16, 16..512 tokens)."""
    return int(min(512, max(16, 16 * round(steps * cal.decode_step_ms / cal.prefill_ms_per_token / 16))))


def draw_chunk_tokens(d: Draw, cal: Calibration) -> int:
    """A chunked draw's prefill budget per step (tokens): the drawn chunk, head-of-line's own, and
    for a KV-capacity draw at least what keeps the prefill budget from binding first.

    With ``fits`` sequences in the KV pool, each holds its blocks for ``x = prompt / chunk``
    prefill steps plus ``out`` decode steps, so the pool admits ``fits / (x + out)`` requests per
    step while the chunk budget admits ``1 / x``; the budget binds first unless
    ``x <= out / (2 fits - 1)`` (a factor 2 to spare); otherwise room for every stream in the pool
    leaves TTFT where it was and the draw's truth is the chunk budget's queue, not the KV cache."""
    p = d.params
    if "hol_chunk" in p:
        return int(p["hol_chunk"])
    chunk = chunk_tokens(cal, p["chunk_steps"])
    if "kv_fits" in p and d.expected == "kv_cache":
        inp = max_tokens(length_spec(input_tokens(d, cal), p["input_spread"]))
        floor = inp * (2 * p["kv_fits"] - 1) / max(1, p["output_tokens"])
        chunk = max(chunk, int(min(512, 16 * math.ceil(floor / 16))))
    return chunk


def _ms(x: float) -> str:
    return f"{x:.2f}ms"


def _healthy_slo(d: Draw, cal: Calibration, inp_max: int) -> str:
    p = d.params
    c = p["concurrency"]
    ttft = 5 * (cal.ttft_short_ms + c * inp_max * cal.prefill_ms_per_token + 2 * cal.decode_step_ms) * p["slo_headroom"]
    if p["policy"] == "chunked":  # each chunk a step of its own: the prompt's prefill takes longer
        ttft += 5 * (inp_max / draw_chunk_tokens(d, cal) + 1) * cal.decode_step_ms
    tpot = (3 + c) * cal.decode_step_ms * p["tpot_headroom"]
    return f"ttft_p99={_ms(ttft)},tpot_p99={_ms(tpot)}"


def dominant_cost_ms(d: Draw, cal: Calibration) -> float:
    """The dominant cause's mean cost per measured request, by design (ms): what a mix's second
    cause is a share of (a second cause on every request must stay below the dominant one's mean)."""
    p, f = d.params, d.params["faults"]
    inp, out = p["input_tokens"], p["output_tokens"]
    if d.family == "queue":
        return max(1.0, (p["concurrency"] / p["max_running"] - 1) / 2) * service_ms(cal, inp, out)
    if d.family == "tokenize":
        return inp * tokenize_ms_per_token(cal, f["tokenize_x"])
    if d.family == "prefill_compute":
        return inp * cal.prefill_ms_per_token
    if d.family == "network":
        return network_ms(cal, f["network_x"])
    if d.family == "frontend":  # waiting for (streams / workers - 1) / 2 whole streams ahead, on average
        return max(1.0, (p["concurrency"] / f["frontend_workers"] - 1) / 2) * service_ms(cal, inp, out)
    if d.family == "pipeline_bubble":  # stages idle (N-1)/N of a one-micro-batch prefill
        return inp * cal.prefill_ms_per_token * (p["pp"] - 1) / p["pp"]
    if d.family == "prefix_cache":  # the prefix prefilled again on R of every R + 1 requests
        r = p["prefix_repeats"]
        return prefix_tokens(cal, p["prefix_x"]) * cal.prefill_ms_per_token * r / (r + 1)
    if d.family == "cold_start":  # the load reaches the first requests only: its mean over the run's requests
        return load_delay_s(cal, f["load_delay_x"]) * 1e3 / p["requests"]
    return out * cal.decode_step_ms  # decode: the stream's own token time


def prefix_tokens(cal: Calibration, x: float) -> int:
    """A shared prefix whose prefill costs ``x`` short-prompt TTFTs (a multiple of 16, 256..1024 tokens)."""
    return int(min(1024, max(256, 16 * round(x * cal.ttft_short_ms / cal.prefill_ms_per_token / 16))))


def tokenize_ms_per_token(cal: Calibration, x: float) -> float:
    return x * max(3 * cal.prefill_ms_per_token, cal.decode_step_ms)


def network_ms(cal: Calibration, x: float) -> float:
    return x * max(20.0, 5 * cal.ttft_short_ms, 60 * cal.decode_step_ms)


def load_delay_s(cal: Calibration, x: float) -> float:
    return x * max(2.0, 100 * cal.ttft_short_ms / 1e3)


def faults_ms(d: Draw, cal: Calibration) -> dict[str, float]:
    """The ``--inject`` knobs in the engine's units, the mix's second cause included."""
    f, p = d.params["faults"], d.params
    out: dict[str, float] = {}
    if "tokenize_x" in f:
        out["tokenize_ms_per_token"] = tokenize_ms_per_token(cal, f["tokenize_x"])
    if "tokenize_pf" in f:
        out["tokenize_ms_per_token"] = f["tokenize_pf"] * cal.prefill_ms_per_token
    if "network_x" in f:
        out["network_delay_ms"] = network_ms(cal, f["network_x"])
    if "network_steps" in f:
        out["network_delay_ms"] = f["network_steps"] * cal.decode_step_ms
    if "collective_x" in f:
        out["collective_latency_ms"] = f["collective_x"] * max(1.0, p["input_tokens"] * cal.prefill_ms_per_token / (2 * LAYERS))
    if "load_delay_x" in f:
        out["load_delay_s"] = load_delay_s(cal, f["load_delay_x"])
    if "frontend_workers" in f:
        out["frontend_workers"] = float(f["frontend_workers"])
    if "stall_steps" in f:
        out["scheduler_stall_ms"] = f["stall_steps"] * cal.decode_step_ms
    if "transfer_x" in f:
        out["kv_transfer_latency_ms"] = f["transfer_x"] * cal.ttft_short_ms
    if d.kind == "mix":
        share_ms = p["mix_share"] * dominant_cost_ms(d, cal)
        if p["mix_second"] == "tokenize":
            out["tokenize_ms_per_token"] = share_ms / p["input_tokens"]
        else:
            out["network_delay_ms"] = share_ms
    return {k: round(v, 4) for k, v in out.items() if v > 0}


def lora_names(n: int) -> tuple[str, ...]:
    """The adapters of a LoRA draw, as served and asked for (``lora0`` ...); () for none."""
    return tuple(f"lora{i}" for i in range(n))


def serve_args(d: Draw, cal: Calibration) -> list[str]:
    p = d.params
    args = ["--policy", p["policy"]]
    if p["policy"] == "chunked":
        args += ["--chunk-size", str(draw_chunk_tokens(d, cal))]
    if "reserve_fits" in p:  # kv_reservation: a KV budget of that many 512-token contexts
        args += ["--kv-admission", p["kv_admission"], "--max-context", str(RESERVE_CONTEXT_TOKENS),
                 "--kv-blocks", str(p["reserve_fits"] * RESERVE_CONTEXT_TOKENS // 16), "--block-size", "16"]
    if "max_running" in p:
        args += ["--max-running", str(p["max_running"])]
    if "keepalive_s" in p:
        args += ["--keepalive-timeout", f"{p['keepalive_s']:.3g}"]
    if "kv_fits" in p:
        need = max_tokens(length_spec(input_tokens(d, cal), p["input_spread"])) + max_tokens(
            length_spec(p["output_tokens"], p["output_spread"]))
        args += ["--kv-blocks", str(p["kv_fits"] * math.ceil(need / p["block_size"])), "--block-size", str(p["block_size"])]
    if p.get("lazy_load"):
        args.append("--lazy-load")
    if p.get("prefix_caching"):
        args.append("--enable-prefix-caching")
    if "pp" in p:
        args += ["--pp", str(p["pp"])]
    if p.get("pd"):
        args.append("--pd")
    if p.get("lora_adapters"):
        args += ["--lora-modules", *lora_names(p["lora_adapters"]), "--max-loras", str(p["max_loras"])]
    for k, v in faults_ms(d, cal).items():
        if k != "collective_latency_ms":
            args += ["--inject", f"{k}={v:.4g}"]
    return args


def long_prompt_tokens(cal: Calibration, steps: float) -> int:
    """head_of_line: a prompt whose prefill lasts ``steps`` decode steps (384..1024 tokens)."""
    return int(min(1024, max(384, steps * cal.decode_step_ms / cal.prefill_ms_per_token)))


def light_prompt_tokens(cal: Calibration, steps: float, out_tokens: int) -> int:
    """A prompt whose prefill lasts ``steps`` decode steps at the calibrated ms/token (16 tokens at
    least; with its output and a +-50% spread, inside the context)."""
    cap = int((MAX_CONTEXT_TOKENS - out_tokens) / 1.5)
    return int(min(cap, max(16, steps * cal.decode_step_ms / cal.prefill_ms_per_token)))


def input_tokens(d: Draw, cal: Calibration) -> int:
    """The draw's prompt tokens on this calibration: the light-load near-miss sizes its own, and a
    near-miss given no SLO keeps its prompt under ``LIGHT_PROMPT_STEPS[1]`` decode steps of prefill
    (:func:`~diag.analysis.scenarios.random_draws.prompt_capped`); every other draw its drawn length."""
    p = d.params
    out = max_tokens(length_spec(p["output_tokens"], p["output_spread"]))
    if "light_steps" in p:
        return light_prompt_tokens(cal, p["light_steps"], out)
    if prompt_capped(d):
        return min(p["input_tokens"], light_prompt_tokens(cal, LIGHT_PROMPT_STEPS[1], out))
    return p["input_tokens"]


def _step(d: Draw, cal: Calibration) -> ProbeStep:
    p = d.params
    n_in = input_tokens(d, cal)
    inp, out = length_spec(n_in, p["input_spread"]), length_spec(p["output_tokens"], p["output_spread"])
    common = dict(input_tokens=inp, output_tokens=out, warmup=p["warmup"], starve_client=bool(p.get("starve_client")),
                  inject_long=(long_prompt_tokens(cal, p["long_steps"]), p["long_every"]) if "long_steps" in p else (0, 0),
                  omit_max_tokens=bool(p.get("omit_max_tokens")), response_format=p.get("response_format"),
                  lora=lora_names(p.get("lora_adapters", 0)),
                  schema_properties=int(p.get("schema_properties", 24)))
    if p["design"] == "sweep":
        values = tuple(float(v) for v in p["sweep_values"])
        if "light_steps" in p:  # shares of the longest prompt
            values = tuple(sorted({float(max(16, round(v * n_in))) for v in values}))
        if p["sweep"] == "rate":  # shares of the admitted capacity -> requests/s
            cap = p.get("max_running", 1) / (service_ms(cal, p["input_tokens"], p["output_tokens"]) / 1e3)
            values = tuple(round(v * cap, 3) for v in values)
        return ProbeStep(sweep=p["sweep"], sweep_values=values, requests_per_point=p["requests_per_point"],
                         concurrency=p["concurrency"], **common)
    if p["design"] == "prefix":  # --shared-prefix N:R, one request at a time; input_tokens is the suffix
        n = prefix_tokens(cal, p["prefix_x"])
        return ProbeStep(concurrency=1, requests=p["requests"], input_tokens=f"fixed:{n + p['input_tokens']}",
                         output_tokens=out, warmup=p["warmup"], shared_prefix=(n, p["prefix_repeats"]))
    rate = None
    if "keepalive_s" in p:  # a mean gap of gap_x idle keep-alive timeouts (wall-clock seconds)
        rate = round(1.0 / (p["keepalive_s"] * p["gap_x"]), 3)
    elif p["design"] == "open":
        admitted = p["max_running"] if d.family == "queue" and d.kind != "near-miss" else 1  # a share of one stream
        rate = round(p["load"] * admitted * 1e3 / service_ms(cal, n_in, p["output_tokens"]), 3)
    return ProbeStep(concurrency=p["concurrency"], requests=p["requests"], rate_rps=rate, **common)


def _interference_prompts(cal: Calibration, p: dict[str, Any]) -> tuple[tuple[int, int], ...]:
    longest = int(min(1792, max(384, p["stall_steps"] * cal.decode_step_ms / cal.prefill_ms_per_token)))
    stream = (16, 32)
    block = (stream,) * p["streams"]
    return (*block, (3 * longest // 5, 4), *block, (4 * longest // 5, 4), *block, (longest, 4))


def build_plan(d: Draw, cal: Calibration) -> Plan:
    """The draw as a plan on this calibration (engine arguments, probe steps, SLOs, injection)."""
    p = d.params
    injected: dict[str, Any] = {"draw": {"seed": d.seed, "index": d.index, "family": d.family, "kind": d.kind},
                                **faults_ms(d, cal)}
    args = serve_args(d, cal)
    step = _step(d, cal)
    # the longest prompt sent: a long-prompt near-miss's users expect its own prefill too
    slo: str | None = _healthy_slo(d, cal, max(max_tokens(step.input_tokens), step.inject_long[0],
                                              max(step.sweep_values) if step.sweep == "prompt" else 0))
    if d.family == "comm":
        ms = faults_ms(d, cal)["collective_latency_ms"]
        phases = (Phase((*args, "--tp", "1"), (ProbeStep(**{**step.__dict__, "segment": "tp=1"}),)),
                  Phase((*args, "--tp", "2", "--inject", f"collective_latency_ms={ms:.4g}"),
                        (ProbeStep(**{**step.__dict__, "segment": "tp=2"}),)))
        return Plan(phases, slo=None, injected={**injected, "tp": [1, 2]})
    if d.family == "interference":
        prompts = _interference_prompts(cal, p)
        longest = max(i for i, _ in prompts)
        step = ProbeStep(concurrency=p["concurrency"], requests=p["requests"], prompts=prompts, warmup=p["warmup"])
        slo = (f"ttft_p99={_ms(16 * longest * cal.prefill_ms_per_token + 20 * cal.ttft_short_ms)},"
               f"itl_p99={_ms(p['itl_steps'] * cal.decode_step_ms)}")
    elif d.family == "decode":
        slo = (f"ttft_p99={_ms(80 * cal.ttft_short_ms + 256 * cal.prefill_ms_per_token)},"
               f"tpot_p99={_ms(p['tpot_steps'] * cal.decode_step_ms)}")
    elif d.family in ("queue", "kv_cache", "cold_start", "loadgen", "prefill_compute", "tokenize", "network",
                      "frontend", "pipeline_bubble", "prefix_cache", "head_of_line", "kv_reservation",
                      "engine_overhead", "grammar_compile", "pd_transfer", "lora_adapters") \
            and d.kind != "near-miss":
        slo = None  # the cause is the answer whatever the users hold, as in the catalogue
    if not p.get("slo_given", True):
        slo = None  # the near-miss space's draws without targets: healthy from the own-work floor alone
    return Plan((Phase(tuple(args), (step,)),), slo=slo, injected=injected)


def scenario(d: Draw) -> Scenario:
    """The draw as a catalogue scenario (ground truth and cause), for the one runner."""
    return Scenario(d.name, d.expected, d.describe(), lambda cal: build_plan(d, cal), fast=False)


__all__ = ["MAX_CONTEXT_TOKENS", "build_plan", "chunk_tokens", "draw_chunk_tokens", "dominant_cost_ms", "faults_ms", "input_tokens",
           "length_spec", "light_prompt_tokens", "max_tokens", "scenario", "serve_args", "service_ms"]
