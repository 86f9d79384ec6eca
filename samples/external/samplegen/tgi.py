"""TGI: metrics-exporter-prometheus 0.15 texts (no ``_total``, Rust f64 formatting) and ``generate_stream`` spans."""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from samplegen.common import Events, attr_kv, export_batches, hex_bits, otlp_request, state_at, unix_ns
from samplegen.sim import NS, SEED, Req, SimResult

TGI_DURATION_BUCKETS: list[float] = []
_v = 0.0001
for _ in range(35):  # router/src/server.rs: geometric from 0.0001 x 1.5, 35 buckets
    _v *= 1.5
    TGI_DURATION_BUCKETS.append(_v)
TGI_MAX_INPUT_TOKENS = 8000
TGI_MAX_TOTAL_TOKENS = 8192
TGI_INPUT_BUCKETS = [TGI_MAX_INPUT_TOKENS / 100.0 * (x + 1) for x in range(100)]
TGI_GENERATED_BUCKETS = [TGI_MAX_TOTAL_TOKENS / 100.0 * (x + 1) for x in range(100)]
TGI_BATCH_MAX_TOTAL_TOKENS = 200000


def _rust_f64(v: float) -> str:
    """f64 as Rust's Display prints it: shortest round-trip digits, no exponent, no '.0'."""
    if v == int(v) and abs(v) < 1e16:
        return str(int(v))
    r = repr(float(v))
    if "e" in r:
        return f"{v:.20f}".rstrip("0")
    return r


class _Hist:
    """A cumulative histogram as an exporter keeps it."""

    def __init__(self, buckets: Sequence[float]) -> None:
        self.bounds = list(buckets)
        self.counts = [0] * len(self.bounds)
        self.total = 0
        self.sum = 0.0

    def observe(self, v: float) -> None:
        for i, b in enumerate(self.bounds):
            if v <= b:
                self.counts[i] += 1
        self.total += 1
        self.sum += v


def _rust_histogram(name: str, labels: str, h: _Hist) -> list[str]:
    sep = "," if labels else ""
    out = [f'{name}_bucket{{{labels}{sep}le="{_rust_f64(b)}"}} {c}' for b, c in zip(h.bounds, h.counts)]
    out.append(f'{name}_bucket{{{labels}{sep}le="+Inf"}} {h.total}')
    lab = f"{{{labels}}}" if labels else ""
    out += [f"{name}_sum{lab} {_rust_f64(h.sum)}", f"{name}_count{lab} {h.total}"]
    return out


def _rust_duration(seconds: float) -> str:
    """A std::time::Duration as its Debug impl prints it ("1.5ms", "2.034s", "850µs")."""
    ns = max(int(round(seconds * 1e9)), 0)
    for unit, scale in (("s", NS), ("ms", 1_000_000), ("µs", 1_000)):
        if ns >= scale:
            whole, frac = divmod(ns, scale)
            digits = len(str(scale)) - 1
            frac_s = f"{frac:0{digits}d}".rstrip("0")
            return f"{whole}.{frac_s}{unit}" if frac_s else f"{whole}{unit}"
    return f"{ns}ns"


@dataclass
class _TgiBatch:
    """One TGI router batch call (prefill of new requests, or one decode step)."""

    t: float
    method: str
    inference_s: float
    forward_s: float


def _tgi_batches(sim: SimResult) -> list[_TgiBatch]:
    out = []
    for s in sim.steps:
        if s.prefill_tokens:
            pf = s.prefill_s + sim.cfg.step_base_s
            out.append(_TgiBatch(s.start + pf, "prefill", pf, pf * 0.93))
        if s.decode_seqs:
            dec = (s.end - s.start) - (s.prefill_s + sim.cfg.step_base_s if s.prefill_tokens else 0.0)
            out.append(_TgiBatch(s.end, "decode", dec, dec * 0.9))
    return out


#: TGI's own descriptions exist for these (router/src/server.rs); the wording here is ours.
TGI_HELP: dict[str, str] = {
    "tgi_request_success": "Requests that succeeded",
    "tgi_request_count": "Requests received",
    "tgi_request_duration": "Time to process a request, end to end",
    "tgi_request_validation_duration": "Time to validate (and tokenize) a request",
    "tgi_request_queue_duration": "Time a request spent queued",
    "tgi_request_inference_duration": "Time a request spent in inference",
    "tgi_request_mean_time_per_token_duration": "Mean time per generated token of a request",
    "tgi_request_generated_tokens": "Tokens generated per request",
    "tgi_request_input_length": "Prompt tokens per request",
    "tgi_batch_inference_count": "Batch inference calls by method",
    "tgi_batch_inference_success": "Successful batch inference calls by method",
    "tgi_batch_current_size": "Requests in the current batch",
    "tgi_queue_size": "Requests in the queue",
    "tgi_batch_current_max_tokens": "Most tokens the current batch may reach",
    "tgi_batch_inference_duration": "Batch inference time by method",
    "tgi_batch_forward_duration": "Shard forward time by method",
}


def tgi_texts(sim: SimResult) -> list[str]:
    """metrics-exporter-prometheus 0.15 rendering of the TGI router's metrics (no ``_total``)."""
    req_h = {k: _Hist(TGI_DURATION_BUCKETS) for k in ("tgi_request_duration", "tgi_request_validation_duration",
                                                       "tgi_request_queue_duration", "tgi_request_inference_duration",
                                                       "tgi_request_mean_time_per_token_duration")}
    inp = _Hist(TGI_INPUT_BUCKETS)
    gen = _Hist(TGI_GENERATED_BUCKETS)
    batch_h = {(n, m): _Hist(TGI_DURATION_BUCKETS) for n in ("tgi_batch_inference_duration",
                                                             "tgi_batch_forward_duration")
               for m in ("prefill", "decode")}
    counts: dict[str, int] = {"count": 0, "success": 0, "prefill": 0, "decode": 0}
    ev = Events()
    for r in sim.reqs:
        ev.add(r.queued, lambda r=r: (inp.observe(r.prompt), counts.__setitem__("count", counts["count"] + 1),
                                      req_h["tgi_request_validation_duration"].observe(r.tokenize_s)))

        def fin(r: Req = r) -> None:
            inference = r.finish - r.scheduled
            req_h["tgi_request_duration"].observe(r.finish - r.arrival)
            req_h["tgi_request_queue_duration"].observe(r.scheduled - r.queued)
            req_h["tgi_request_inference_duration"].observe(inference)
            req_h["tgi_request_mean_time_per_token_duration"].observe(inference / r.output)
            gen.observe(r.output)
            counts["success"] += 1

        ev.add(r.finish, fin)
    for b in _tgi_batches(sim):
        def batch(b: _TgiBatch = b) -> None:
            batch_h[("tgi_batch_inference_duration", b.method)].observe(b.inference_s)
            batch_h[("tgi_batch_forward_duration", b.method)].observe(b.forward_s)
            counts[b.method] += 1

        ev.add(b.t, batch)
    texts = []
    for t in sim.scrape_times:
        ev.until(t)
        st = state_at(sim, t)
        cur_max = sum(min(r.prompt + r.output, TGI_MAX_TOTAL_TOKENS) for r in sim.reqs
                      if r.scheduled <= t < r.finish)
        fams: dict[str, tuple[str, list[str]]] = {
            "tgi_request_count": ("counter", [f"tgi_request_count {counts['count']}"]),
            "tgi_request_success": ("counter", [f"tgi_request_success {counts['success']}"]),
            "tgi_batch_inference_count": ("counter", [
                f'tgi_batch_inference_count{{method="{m}"}} {counts[m]}' for m in ("decode", "prefill")]),
            "tgi_batch_inference_success": ("counter", [
                f'tgi_batch_inference_success{{method="{m}"}} {counts[m]}' for m in ("decode", "prefill")]),
            "tgi_queue_size": ("gauge", [f"tgi_queue_size {st.waiting}"]),
            "tgi_batch_current_size": ("gauge", [f"tgi_batch_current_size {st.running}"]),
            "tgi_batch_current_max_tokens": ("gauge", [f"tgi_batch_current_max_tokens {cur_max}"]),
            "tgi_batch_max_total_tokens": ("gauge", [f"tgi_batch_max_total_tokens {TGI_BATCH_MAX_TOTAL_TOKENS}"]),
            "tgi_request_input_length": ("histogram", _rust_histogram("tgi_request_input_length", "", inp)),
            "tgi_request_generated_tokens": ("histogram", _rust_histogram("tgi_request_generated_tokens", "", gen)),
        }
        for name, h in req_h.items():
            fams[name] = ("histogram", _rust_histogram(name, "", h))
        for name in ("tgi_batch_inference_duration", "tgi_batch_forward_duration"):
            lines: list[str] = []
            for m in ("decode", "prefill"):
                lines += _rust_histogram(name, f'method="{m}"', batch_h[(name, m)])
            fams[name] = ("histogram", lines)
        out: list[str] = []
        for name in sorted(fams):
            typ, lines = fams[name]
            if name in TGI_HELP:
                out.append(f"# HELP {name} {TGI_HELP[name]}")
            out.append(f"# TYPE {name} {typ}")
            out += lines
            out.append("")
        texts.append("\n".join(out))
    return texts


def tgi_spans(sim: SimResult) -> list[dict[str, Any]]:
    """The router's ``generate_stream`` span with its timing fields as Rust Debug durations."""
    rng = random.Random(SEED + 3)
    items = []
    for r in sim.reqs:
        inference = r.finish - r.scheduled
        attrs = [
            attr_kv("total_time", _rust_duration(r.finish - r.arrival)),
            attr_kv("validation_time", _rust_duration(r.tokenize_s)),
            attr_kv("queue_time", _rust_duration(r.scheduled - r.queued)),
            attr_kv("inference_time", _rust_duration(inference)),
            attr_kv("time_per_token", _rust_duration(inference / r.output)),
        ]
        items.append((r.finish, {
            "traceId": hex_bits(rng, 128), "spanId": hex_bits(rng, 64), "parentSpanId": "", "name": "generate_stream",
            "kind": 1, "startTimeUnixNano": str(unix_ns(r.arrival)), "endTimeUnixNano": str(unix_ns(r.finish)),
            "attributes": attrs, "status": {},
        }))
    return [otlp_request("text-generation-inference.router", "text_generation_router", b)
            for b in export_batches(items, 5.0)]
