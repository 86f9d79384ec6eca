"""``ttft diagnose URL``: one command for "my server is slow" — an adaptive sequence of probes
(compatibility and warm-up, a lone-request baseline, a prompt ladder, a concurrency or rate
ramp, the levels in between where the break skipped some), each chosen from what the previous
ones showed, stopping once the verdict is confident or the budget is spent. Prints the steps and
why, the goodput within ``--slo``, and the verdict as ``ttft analyze`` gives it; writes one
capture that ``ttft analyze``, ``ttft report`` and ``ttft view`` read.

Exit codes (:mod:`diag.ground.exit_codes`): 0 when it ran, 130 when interrupted (the capture is still
valid and diagnosed), 2 on usage errors, an unreachable server or nothing to judge (one line on
stderr). ``--slo`` is no gate here: the ramp crosses it on purpose (gate with ``ttft analyze``).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path
from typing import Any

from diag.cli.commands.probe import add_metrics, add_ray, add_wait_ready, check_metrics, check_ray


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "diagnose",
        help="design and run the probes that find why TTFT is high, and give the verdict",
        description="Run an adaptive, designed sequence of probes against an OpenAI-compatible server: "
        "compatibility and warm-up, a lone-request baseline, a prompt-length ladder at concurrency 1 (below the "
        "server's context limit), a concurrency (or rate) ramp until TTFT or ITL breaks, then the levels in "
        "between. Each step is chosen from the previous ones, with the reason printed. Stops when the verdict "
        "is confident or --budget is spent. Bounded concurrency and request count; stops on error bursts; "
        "Ctrl-C leaves a valid capture.",
        epilog="exit codes: 0 ok (--slo sets where the ramp stops and what goodput counts: the ramp crosses it on "
        "purpose, so a broken SLO is no gate here; gate with `ttft analyze CAPTURE --slo ...`); 2 bad input, an "
        "unreachable server or nothing to judge (verdict no_data); 130 interrupted (the capture is still valid)",
    )
    p.add_argument("url", metavar="URL", help="server base URL (http://HOST:PORT) or the full endpoint URL")
    p.add_argument("--model", metavar="NAME", help="model name (default: the first of GET /v1/models)")
    p.add_argument("--api", choices=["completions", "chat"], help="which API (default: from the URL, else detected)")
    p.add_argument("--api-key", metavar="KEY", help="bearer token (default: $OPENAI_API_KEY); never recorded")
    p.add_argument("--slo", metavar="SPEC", help="SLOs for the verdict, the ramp's stop and goodput, e.g. ttft_p99=2s,tpot_p99=100ms")
    p.add_argument("--workload", metavar="SPEC",
                   help="what your users send, lengths only: prompt_tokens=MIN-MAX,shared_prefix=N (tokens), "
                        "concurrency=N (the most requests they keep in flight), response_format=none|json|schema, "
                        "lora=A+B+... (adapters they use). Findings that hold only for some prompts (a repeated "
                        "prefix recomputed, short prompts behind long ones) are then judged for yours instead of "
                        "conditional, whether anything waits is judged at your load, and structured output and "
                        "LoRA adapters get a follow-up of their own")
    p.add_argument("--schema", metavar="FILE.json", help="with --workload response_format=schema: your users' JSON "
                   "schema for the grammar follow-up (default: a generated one of --schema-properties fields)")
    p.add_argument("--schema-properties", type=int, default=24, metavar="N",
                   help="fields of the grammar follow-up's generated schema (default 24; size it like your users')")
    p.add_argument("--budget", default="120s", metavar="T", help="probing time budget, e.g. 120s or 3m (default 120s)")
    add_metrics(p)
    p.add_argument("--join", action="append", default=[], metavar="SERVER_CAPTURE",
                   help="a server capture (ttft serve --capture, ttft instrument, ttft receive) to join into the verdict")
    p.add_argument("--ramp", choices=["concurrency", "rate"], default="concurrency",
                   help="closed-loop concurrency ramp (default) or open-loop rate ramp")
    p.add_argument("--max-concurrency", type=int, default=32, metavar="C", help="most requests in flight (default 32)")
    p.add_argument("--max-requests", type=int, default=1000, metavar="N", help="most requests in all (default 1000)")
    p.add_argument("--input-tokens", type=int, metavar="N", help="prompt of the baseline and the ramp (default 64, or the middle "
                   "of --workload prompt_tokens when shorter)")
    p.add_argument("--output-tokens", type=int, default=32, metavar="N", help="tokens per answer (default 32)")
    p.add_argument("--max-prompt", type=int, default=4096, metavar="N", help="longest prompt of the ladder (default 4096, "
                   "and below the server's context limit)")
    p.add_argument("--no-exact-output", action="store_true", help="do not send min_tokens/ignore_eos")
    p.add_argument("--no-request-id", action="store_true", help="do not send an X-Request-Id header")
    p.add_argument("--no-traceparent", action="store_true", help="do not send the W3C traceparent header")
    p.add_argument("--no-stream-options", action="store_true", help="do not send stream_options.include_usage")
    p.add_argument("--tokenizer", metavar="PATH", help="tokenizer.json for exact prompt lengths")
    p.add_argument("--rules", metavar="FILE", help="TOML file overriding rule thresholds")
    p.add_argument("--timeout", type=float, default=30.0, metavar="S", help="seconds without a byte before a request fails (default 30)")
    add_wait_ready(p)
    p.add_argument("--workers", type=int, default=1, metavar="N",
                   help="client processes each step's load is split over (default 1); with --ray, Ray actors")
    add_ray(p)
    p.add_argument("--seed", type=int, default=0, help="random seed for prompts and arrivals")
    p.add_argument("-o", "--output", metavar="CAPTURE", help="capture directory (default: diagnose-YYYYmmdd-HHMMSS)")
    p.add_argument("--json", action="store_true", help="print the run and the verdict as JSON on stdout")
    p.add_argument("--no-progress", action="store_true", help="no live progress on stderr")
    return p


def _usage(msg: str) -> Exception:
    from diag.cli import UsageError

    return UsageError(msg)


def parse_budget(text: str) -> float:
    """``120``, ``120s``, ``2m``, ``1.5m`` -> seconds (> 0); raises a usage error."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*(s|m|min)?\s*", text or "")
    if not m:
        raise _usage(f"bad --budget {text!r}: expected seconds, e.g. 120s or 2m")
    value = float(m.group(1)) * (60.0 if m.group(2) in ("m", "min") else 1.0)
    if value <= 0:
        raise _usage("--budget must be > 0")
    return value


class _Live:
    """Live progress on stderr: the step, why, what it showed, the running verdict."""

    def __init__(self, stream: Any = None) -> None:
        from diag.cli.commands.probe import ProgressLine

        self.stream = stream if stream is not None else sys.stderr
        self.bar = ProgressLine(self.stream) if self.stream.isatty() else None

    def __call__(self, kind: str, payload: Any) -> None:
        if self.bar is not None:
            self.bar.finish()
        if kind in ("note", "wait"):
            self.stream.write(f"  note: {payload}\n")
        elif kind == "step":
            from diag.analysis.diagnose.design import segment_of

            s = payload.step
            self.stream.write(f"[{payload.started_s:5.1f} s] step {payload.index}: {s.stage} {segment_of(s.kind, s.value)} "
                              f"({s.requests} requests) — {s.reason}\n")
        elif kind == "point" and payload.point is not None:
            from diag.ground.units import fmt_s

            p = payload.point
            over = f", {p.over_context} refused as longer than the context (its limit)" if p.over_context else ""
            self.stream.write(f"           {p.ok}/{p.requests} ok{over}, TTFT p50 {fmt_s(p.ttft_p50_s)}, ITL p50 "
                              f"{fmt_s(p.itl_p50_s)}, {p.rps:.2f} req/s in {p.wall_s:.1f} s\n")
        elif kind == "verdict" and payload.verdict:
            self.stream.write(f"           running verdict: {payload.verdict} ({payload.confidence:.2f})\n")
        elif kind == "stopped":
            self.stream.write(f"stopped: {payload}\n")
        self.stream.flush()


def _waits_only(kind: str, payload: Any) -> None:
    """--no-progress: only a wait for a server that is not serving yet is said at once (stderr)."""
    if kind == "wait":
        print(f"ttft diagnose: {payload}", file=sys.stderr, flush=True)


def run(args: argparse.Namespace) -> int:
    import os

    from collectors.probe.endpoint import split_url
    from diag.ground.exit_codes import BAD_INPUT, INTERRUPTED, OK
    from diag.analysis.diagnose import DiagnoseConfig, PlanConfig, format_result, run_diagnose
    from diag.analysis.report.text import format_analysis
    from diag.ground.slo import slo_option

    try:
        split_url(args.url)
    except ValueError as exc:
        raise _usage(str(exc)) from exc
    budget = parse_budget(args.budget)
    from diag.analysis.diagnose.design import DEFAULT_INPUT_TOKENS
    from diag.analysis.diagnose.users_workload import parse_users_workload, ramp_prompt_tokens

    try:
        workload = parse_users_workload(args.workload) if args.workload else None
    except ValueError as exc:
        raise _usage(str(exc)) from exc
    if args.schema is not None or args.schema_properties != 24:
        from collectors.probe.schemas import SchemaSpecError, parse_response_format

        if workload is None or workload.response_format != "schema":
            raise _usage("--schema and --schema-properties go with --workload response_format=schema")
        try:
            parse_response_format("schema", args.schema_properties, args.schema)
        except SchemaSpecError as exc:
            raise _usage(str(exc)) from exc
    try:
        plan = PlanConfig(input_tokens=ramp_prompt_tokens(workload, args.input_tokens, DEFAULT_INPUT_TOKENS),
                          schema_file=args.schema, schema_properties=args.schema_properties,
                          output_tokens=args.output_tokens,
                          max_concurrency=args.max_concurrency, max_prompt_tokens=args.max_prompt, budget_s=budget,
                          max_requests=args.max_requests, ramp=args.ramp)
    except ValueError as exc:
        raise _usage(str(exc).replace("max_prompt_tokens", "--max-prompt").replace("_", "-")) from exc
    if args.timeout <= 0:
        raise _usage("--timeout must be > 0")
    if args.wait_ready < 0:
        raise _usage("--wait-ready must be >= 0")
    if args.workers < 1:
        raise _usage("--workers must be >= 1")
    ray_address = check_ray(args.ray)
    metrics = check_metrics(args.metrics)
    for j in args.join:
        if not Path(j).exists():
            raise _usage(f"--join {j}: no such capture")
    if args.rules:
        from rules import load_thresholds

        plan = type(plan)(**{**plan.__dict__, "thresholds": load_thresholds(args.rules)})
    output = Path(args.output or time.strftime("diagnose-%Y%m%d-%H%M%S"))
    dropped = frozenset(e for e, off in (("x_request_id", args.no_request_id), ("traceparent", args.no_traceparent),
                                         ("stream_options", args.no_stream_options)) if off)
    cfg = DiagnoseConfig(args.url, output, plan, api=args.api, model=args.model,
                         api_key=args.api_key or os.environ.get("OPENAI_API_KEY"), slo=slo_option(args.slo),
                         metrics_url=metrics, join=list(args.join), rules_file=args.rules,
                         tokenizer_path=args.tokenizer, exact_output=not args.no_exact_output, dropped=dropped,
                         timeout_s=args.timeout, seed=args.seed, wait_ready_s=args.wait_ready, workload=workload,
                         workers=args.workers, ray_address=ray_address)
    live = None if args.no_progress else _Live()
    res = run_diagnose(cfg, on_event=live or _waits_only, progress=live.bar if live is not None else None)
    if args.json:
        json.dump(res.to_dict(), sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        print(format_result(res, format_analysis(res.analysis) if res.analysis is not None else None))
    if res.interrupted:
        return INTERRUPTED
    if res.analysis is None or res.analysis.diagnosis is None or res.analysis.diagnosis.verdict.category == "no_data":
        print("ttft diagnose: nothing to judge: no request was answered", file=sys.stderr)
        return BAD_INPUT
    return OK
