"""``ttft probe URL``: drive a designed load at an OpenAI-compatible streaming endpoint, print
what users experience, and write a capture (client spans joined to the server's by W3C
``traceparent``) that ``ttft analyze`` can diagnose.

Exit codes: 0 when the probe ran (even if requests failed: they are counted by kind),
2 on usage errors (one line on stderr, via diag.cli's UsageError / CaptureError).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

HELP_SPEC = "token length: N, fixed:N, uniform:A-B or normal:MEAN,STD"


def add_wait_ready(p: argparse.ArgumentParser) -> None:
    """``--wait-ready S``, as ``ttft probe`` and ``ttft diagnose`` both take it."""
    p.add_argument("--wait-ready", type=float, default=60.0, metavar="S",
                   help="wait this long for a server that is not serving yet (connection refused, HTTP 503 "
                        "'Loading model'), reported as start-up; 0 does not wait (default 60)")


def add_ray(p: argparse.ArgumentParser) -> None:
    """``--ray ADDRESS``, as ``ttft probe`` and ``ttft diagnose`` both take it."""
    p.add_argument("--ray", metavar="ADDRESS", default=None,
                   help="run the --workers as Ray actors on a cluster: auto (the one 'ray start' joined), "
                        "ray://HOST:10001, HOST:PORT, or local (start Ray on this machine's CPUs); needs the ray "
                        "extra (pip install 'ttft-diag[ray]')")


#: ``--metrics``'s help, as ``ttft probe``, ``ttft diagnose`` and ``ttft watch`` take it
METRICS_HELP = ("the engine's Prometheus /metrics, scraped into the capture alongside (URL, or the server's base URL); "
                "a disaggregated prefill/decode pair: --metrics prefill=URL --metrics decode=URL, each instance's "
                "own /metrics, its series labelled with its role")


def add_metrics(p: argparse.ArgumentParser, help_text: str = METRICS_HELP) -> None:
    """``--metrics URL`` or ``--metrics ROLE=URL`` repeated (``prefill``, ``decode``)."""
    p.add_argument("--metrics", metavar="[ROLE=]URL", action="append", default=None, help=help_text)


def check_metrics(values: list[str] | None) -> tuple[str, ...] | None:
    """The checked ``--metrics`` values (None without any); a one-line usage error for an unknown role,
    a pair missing a side or two bare URLs."""
    if not values:
        return None
    from collectors.prometheus import metrics_targets

    try:
        metrics_targets(values)
    except ValueError as exc:
        raise _usage(str(exc)) from exc
    return tuple(values)


def check_ray(address: str | None) -> str | None:
    """The checked ``--ray`` address (None without one); a usage error when it is malformed or Ray is
    not installed."""
    if address is None:
        return None
    from collectors.probe.ray_workers import RayWorkersError, check_address, require_ray

    try:
        address = check_address(address)
        require_ray()
    except RayWorkersError as exc:
        raise _usage(str(exc)) from exc
    return address


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "probe",
        help="measure TTFT of any OpenAI-compatible endpoint and write a capture",
        description="Stream requests at an OpenAI-compatible /v1/completions or /v1/chat/completions endpoint "
        "(vLLM, SGLang, TGI, llama.cpp, TensorRT-LLM, the bundled engine), time every stage the client can "
        "see, and write a capture. TTFT ends at the first event with non-empty content (role-only chunks do "
        "not count).",
    )
    p.add_argument("url", metavar="URL", help="server base URL (http://HOST:PORT) or the full endpoint URL")
    p.add_argument("--api", choices=["completions", "chat"], help="which API (default: from the URL, else detected)")
    p.add_argument("--model", metavar="NAME", help="model name (default: the first of GET /v1/models)")
    p.add_argument("--api-key", metavar="KEY", help="bearer token (default: $OPENAI_API_KEY); never recorded")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--concurrency", "-c", type=int, metavar="C", help="closed loop with C requests in flight (default 1); "
                   "with --rate: the cap on requests in flight")
    g.add_argument("--rate", "-r", type=float, metavar="R", help="open loop: R requests/s (Poisson; see --burstiness)")
    p.add_argument("--max-concurrency", type=int, metavar="C", help="with --rate: cap on requests in flight (default 256)")
    p.add_argument("--burstiness", type=float, default=1.0, metavar="B",
                   help="gamma shape of inter-arrival times: 1 = Poisson, < 1 burstier, > 1 smoother")
    b = p.add_mutually_exclusive_group()
    b.add_argument("--requests", "-n", type=int, metavar="N", help="measured requests (per sweep point); default 100")
    b.add_argument("--duration", "-d", type=float, metavar="S", help="measure for S seconds (per sweep point)")
    p.add_argument("--warmup", type=int, default=2, metavar="N", help="warm-up requests excluded from results (default 2)")
    p.add_argument("--input-tokens", default="fixed:256", metavar="SPEC", help=f"prompt {HELP_SPEC} (default fixed:256)")
    p.add_argument("--output-tokens", metavar="SPEC", help=f"output {HELP_SPEC} (default fixed:64; 16 in prompt sweeps)")
    p.add_argument("--no-exact-output", action="store_true",
                   help="do not send min_tokens/ignore_eos (for servers that reject them)")
    p.add_argument("--no-request-id", action="store_true",
                   help="do not send an X-Request-Id header (the probe's is a UUID; the trace id joins anyway)")
    p.add_argument("--no-traceparent", action="store_true",
                   help="do not send the W3C traceparent header (client and server traces then do not join)")
    p.add_argument("--no-stream-options", action="store_true",
                   help="do not send stream_options.include_usage (token counts then come from the stream)")
    p.add_argument("--no-compat-check", action="store_true",
                   help="skip the first-request check that finds which optional element a server refuses")
    p.add_argument("--shared-prefix", default="0", metavar="N[:R]",
                   help="a deliberate N-token prefix shared by every prompt (default 0: every prompt starts differently); "
                   "N:R: groups of a fresh N-token prefix used by R prompts, then one prompt of the suffix alone (a "
                   "control), so that TTFT on repeats shows whether the server's prefix cache works (use --concurrency 1)")
    p.add_argument("--inject-long", default=None, metavar="TOKENS:EVERY",
                   help="every EVERY-th prompt has TOKENS tokens instead of --input-tokens: a long prompt among short "
                   "ones, so that short requests' TTFT with a long one in flight shows head-of-line blocking; alone, the "
                   "same load runs first without long prompts (the control)")
    p.add_argument("--response-format", metavar="SPEC", default=None,
                   help="structured output, to see the server's grammar compilation: json (json_object), schema:fresh "
                   "(a new JSON schema on every request), schema:repeat (one schema for the run), schema:R or schema "
                   "(groups of R requests per fresh schema, default 4: first uses and repeats in one capture)")
    p.add_argument("--schema", metavar="FILE.json", help="with --response-format schema[:MODE]: send this JSON schema "
                   "(fresh uses get a distinct title) instead of a generated one")
    p.add_argument("--schema-properties", type=int, default=24, metavar="N",
                   help="fields of the generated schema (default 24; more fields, a longer compile)")
    p.add_argument("--lora", metavar="A,B,...", help="LoRA adapters, by the names the server serves them (its model "
                   "names): the requests ask for the first only, then for one of all of them at random, at the same "
                   "load (a lora sweep), so that waits for an adapter slot or load show (use a concurrency above 1)")
    p.add_argument("--prompts", metavar="FILE.jsonl", help='JSONL prompts: {"prompt": ...} or {"messages": [...]}, optional max_tokens')
    p.add_argument("--tokenizer", metavar="PATH", help="tokenizer.json for exact prompt lengths and token counts")
    p.add_argument("--sweep", choices=["prompt", "concurrency", "rate", "lora"],
                   help="sweep one dimension; each point a capture segment (lora: how many of --lora's adapters)")
    p.add_argument("--sweep-values", metavar="LIST", help="sweep points, e.g. 64,256,1024 (default: doubling)")
    p.add_argument("--sweep-max", type=float, metavar="V", help="last default sweep point (prompt 4096, concurrency 64, rate 32)")
    p.add_argument("--slo", metavar="SPEC", help="SLOs for goodput and sweep stops, e.g. ttft_p99=2s,tpot_p99=100ms")
    add_metrics(p)
    p.add_argument("--gpu", action="store_true", help="sample local GPUs (NVML) into the capture while probing")
    p.add_argument("--workers", type=int, default=1, metavar="N", help="client processes (when one core cannot keep up); "
                   "with --ray, Ray actors")
    add_ray(p)
    p.add_argument("--otlp", metavar="URL", default=None,
                   help="also export the client spans over OTLP/HTTP to URL (default: OTEL_EXPORTER_OTLP_TRACES_ENDPOINT "
                   "or OTEL_EXPORTER_OTLP_ENDPOINT when set); the capture is written as well")
    p.add_argument("--cpus", metavar="LIST", help="pin the probe's processes to these CPUs, e.g. 3 or 2-3 (keep the client "
                   "off the engine's cores when both share a machine; each worker its own CPU when there are enough)")
    p.add_argument("--timeout", type=float, default=60.0, metavar="S", help="seconds without a byte before a request fails (default 60)")
    add_wait_ready(p)
    p.add_argument("--seed", type=int, default=0, help="random seed for prompts and arrivals")
    p.add_argument("--record-prompts", action="store_true", help="store prompt text on the spans (off by default)")
    p.add_argument("-o", "--output", metavar="CAPTURE", help="capture directory to write (default: probe-YYYYmmdd-HHMMSS)")
    p.add_argument("--no-capture", action="store_true", help="write no capture")
    p.add_argument("--json", action="store_true", help="print the results as JSON on stdout")
    p.add_argument("--progress", dest="progress", action="store_true", default=None, help="force the progress line")
    p.add_argument("--no-progress", dest="progress", action="store_false", help="no progress line")
    return p


def _usage(msg: str) -> Exception:
    from diag.cli import UsageError

    return UsageError(msg)


class ProgressLine:
    """A single updating stderr line, at most every 0.2 s (called on the probe's loop)."""

    def __init__(self, stream: Any = None) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self._last = 0.0
        self._t0 = time.monotonic()
        self._label = ""

    def __call__(self, done: int, total: int | None, label: str) -> None:
        now = time.monotonic()
        if label != self._label:
            self._label, self._t0 = label, now
        elif now - self._last < 0.2 and done != total:
            return
        self._last = now
        elapsed = now - self._t0
        rate = done / elapsed if elapsed > 0 else 0.0
        if total:
            width = 24
            fill = int(width * min(1.0, done / total))
            bar = "#" * fill + "-" * (width - fill)
            eta = f"  ETA {(total - done) / rate:4.0f}s" if rate > 0 and done < total else ""
            text = f"\r{label}: [{bar}] {done}/{total}  {rate:5.1f} req/s  {elapsed:5.1f}s{eta}"
        else:
            text = f"\r{label}: {done} done  {rate:5.1f} req/s  {elapsed:5.1f}s"
        self.stream.write(text + "\033[K")
        self.stream.flush()

    def finish(self) -> None:
        if self._label:
            self.stream.write("\r\033[K")
            self.stream.flush()


def build_config(args: argparse.Namespace) -> tuple[Any, Any]:
    """ProbeConfig (and SweepSpec or None) from parsed arguments; raises a usage error."""
    from collectors.probe import LengthSpec, LoadSpec, ProbeConfig, SweepSpec, WorkloadSpec
    from collectors.probe.sweep import parse_values

    try:
        inp = LengthSpec.parse(args.input_tokens)
        out = LengthSpec.parse(args.output_tokens or ("fixed:16" if args.sweep == "prompt" else "fixed:64"))
    except ValueError as exc:
        raise _usage(str(exc)) from exc
    from diag.ground.slo import slo_option

    slo = slo_option(args.slo)
    if args.workers < 1:
        raise _usage("--workers must be >= 1")
    ray_address = check_ray(args.ray)
    metrics = check_metrics(args.metrics)
    if ray_address is not None and args.cpus is not None:
        raise _usage("--cpus pins processes on this machine; Ray places --ray workers itself (drop one of them)")
    cpus = None
    if args.cpus is not None:
        from collectors.probe.affinity import check_cpus, parse_cpu_list

        try:
            cpus = parse_cpu_list(args.cpus)
            check_cpus(cpus)
        except ValueError as exc:
            raise _usage(str(exc)) from exc
    if args.timeout <= 0:
        raise _usage("--timeout must be > 0")
    if args.wait_ready < 0:
        raise _usage("--wait-ready must be >= 0")
    from collectors.otel_env import check_protocol, endpoint_from_env

    otlp = args.otlp if args.otlp is not None else endpoint_from_env()
    if otlp is not None:
        try:
            check_protocol()
        except ValueError as exc:
            raise _usage(str(exc)) from exc
    try:
        prefix_n, _, prefix_r = str(args.shared_prefix).partition(":")
        shared_prefix, shared_repeats = int(prefix_n), int(prefix_r or 0)
    except ValueError:
        raise _usage(f"--shared-prefix {args.shared_prefix!r}: expected N or N:R (integers)") from None
    if shared_prefix < 0 or shared_repeats < 0 or (prefix_r and (shared_prefix < 1 or shared_repeats < 1)):
        raise _usage("--shared-prefix must be N >= 0, or N:R with N >= 1 and R >= 1")
    long_tokens, long_every = 0, 0
    if args.inject_long:
        t, sep, e = str(args.inject_long).partition(":")
        try:
            long_tokens, long_every = int(t), int(e)
        except ValueError:
            raise _usage(f"--inject-long {args.inject_long!r}: expected TOKENS:EVERY (integers)") from None
        if not sep or long_tokens < 1 or long_every < 2:
            raise _usage("--inject-long must be TOKENS:EVERY with TOKENS >= 1 and EVERY >= 2")
        if args.prompts or args.sweep == "prompt":
            raise _usage("--inject-long goes with synthetic prompts at one length (not --prompts or --sweep prompt)")
    if args.prompts and args.sweep == "prompt":
        raise _usage("--sweep prompt makes synthetic prompts; it cannot use --prompts")
    response_format = None
    if args.response_format is not None:
        from collectors.probe.schemas import SchemaSpecError, parse_response_format

        try:
            response_format = parse_response_format(args.response_format, args.schema_properties, args.schema)
        except SchemaSpecError as exc:
            raise _usage(str(exc)) from exc
    elif args.schema is not None:
        raise _usage("--schema goes with --response-format schema[:MODE]")
    lora: tuple[str, ...] = ()
    if args.lora is not None:
        from collectors.probe.lora import LoraSpecError, parse_lora

        try:
            lora = parse_lora(args.lora)
        except LoraSpecError as exc:
            raise _usage(str(exc)) from exc
    if args.max_concurrency is not None and args.rate is None and args.sweep != "rate":
        raise _usage("--max-concurrency goes with --rate (use --concurrency for a closed loop)")
    if args.rate is not None and args.sweep == "rate":
        raise _usage("--rate and --sweep rate: give the rates with --sweep-values")
    conc = args.concurrency if args.concurrency is not None else (args.max_concurrency or (256 if args.rate else 1))
    try:
        load = LoadSpec(concurrency=conc, rate_rps=args.rate, burstiness=args.burstiness, requests=args.requests,
                        duration_s=args.duration, warmup_requests=args.warmup, seed=args.seed)
    except ValueError as exc:
        raise _usage(str(exc)) from exc
    wl = WorkloadSpec(inp, out, shared_prefix, args.prompts, not args.no_exact_output, args.seed,
                      shared_prefix_repeats=shared_repeats, inject_long_tokens=long_tokens, inject_long_every=long_every,
                      response_format=response_format, lora_adapters=lora)
    output = None
    if not args.no_capture:
        output = args.output or time.strftime("probe-%Y%m%d-%H%M%S")
    cfg = ProbeConfig(
        url=args.url, api=args.api, model=args.model, api_key=args.api_key or os.environ.get("OPENAI_API_KEY"),
        load=load, workload=wl, tokenizer_path=args.tokenizer, timeout_s=args.timeout, workers=args.workers,
        output=output, slo=slo, metrics_url=metrics, gpu=args.gpu, record_prompts=args.record_prompts,
        concurrency_set=args.concurrency is not None or args.max_concurrency is not None,
        dropped=frozenset(e for e, off in (("x_request_id", args.no_request_id), ("traceparent", args.no_traceparent),
                                           ("stream_options", args.no_stream_options)) if off),
        compat_check=not args.no_compat_check, cpus=cpus, otlp_endpoint=otlp,
        wait_ready_s=args.wait_ready, on_wait=lambda line: print(line, file=sys.stderr, flush=True),
        ray_address=ray_address,
    )
    sweep = None
    # --lora A,B: one adapter, then all of them; --inject-long alone: no long prompt, then every EVERY-th
    kind = args.sweep or ("lora" if len(lora) > 1 else "long_every" if long_every else None)
    if kind == "lora" and len(lora) < 2:
        raise _usage("--sweep lora needs --lora with two or more adapters")
    if kind:
        try:
            values = parse_values(args.sweep_values) if args.sweep_values else None
            top = float(len(lora)) if kind == "lora" else float(long_every) if kind == "long_every" else args.sweep_max
            if kind == "lora" and values and max(values) > len(lora):
                raise ValueError(f"--sweep-values: at most {len(lora)} adapters (--lora names {len(lora)})")
            sweep = SweepSpec(kind, values, top, args.requests, args.duration)
        except ValueError as exc:
            raise _usage(str(exc)) from exc
    elif args.sweep_values or args.sweep_max:
        raise _usage("--sweep-values/--sweep-max need --sweep prompt|concurrency|rate")
    return cfg, sweep


def run(args: argparse.Namespace) -> int:
    from collectors.probe import format_metrics, format_sweep_table, run_probe, run_sweep
    from collectors.probe.endpoint import split_url

    try:
        split_url(args.url)
    except ValueError as exc:
        raise _usage(str(exc)) from exc
    cfg, sweep = build_config(args)
    show = args.progress if args.progress is not None else (sys.stderr.isatty() and not args.json)
    bar = ProgressLine() if show else None
    cfg.progress = bar
    try:
        result = run_sweep(cfg, sweep) if sweep is not None else run_probe(cfg)
    finally:
        if bar is not None:
            bar.finish()
    if args.json:
        from diag.ground.units import json_safe

        json.dump(json_safe(result.to_dict()), sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0
    ep = result.endpoint
    print(f"ttft probe {ep.url} ({ep.api}, model {ep.model or '-'})")
    for note in result.notes:
        print(f"  note: {note}")
    if result.segments:
        limit = (result.sweep or {}).get("context_limit") or {}
        print(format_sweep_table(result.segments, limit.get("refused_segments") or ()))
        if result.sweep and result.sweep.get("stopped"):
            print(f"sweep stopped: {result.sweep['stopped']}")
        print()
    print(format_metrics(result.metrics))
    h = result.client_health
    lag = h.get("loop_lag_p99_s")
    print(f"client: {'SATURATED — ' if h.get('saturated') else ''}{h.get('reason')}"
          + (f" (loop lag p99 {lag * 1e3:.2f} ms, CPU max {h.get('cpu_pct_max') or 0:.0f}%)" if lag is not None else ""))
    cpu_note = (h.get("client_cpu") or {}).get("note")
    if cpu_note:
        print(f"client: {cpu_note}")
    retry_note = (h.get("connection_retries") or {}).get("note")
    if retry_note:
        print(f"client: {retry_note}")
    if result.capture_path:
        print(f"capture: {result.capture_path}  (ttft analyze {result.capture_path} [SERVER_CAPTURE])")
    return 0

