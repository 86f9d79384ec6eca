"""The Python steps of ``benchmarks/gpu_check.sh``: each subcommand prints a short, readable
section for the summary and exits 0 when its check passed, 1 when it failed.

Subcommands:

* ``env``: Python, torch, CUDA, NCCL, GPU count and names, the project's imports that fail;
* ``engine``: the bundled engine (``ttft serve`` in its own process, :class:`EngineProcess`)
  on ``--device`` with ``--tp``/``--pp``, a short probe against it, the verdict of client +
  server captures;
* ``nvml``: :class:`collectors.nvml.NvmlSampler` against the real driver: every series' last
  value, or the reason it is not sampled;
* ``scenarios``: a calibration on ``--device`` first, then the fixed catalogue with every
  engine on that device, fast scenarios first, until ``--budget-s`` runs out (the rest are
  listed as not reached); scenarios that need more GPUs than there are are skipped.

Run from the repository root: ``python benchmarks/gpu_check_steps.py SUBCOMMAND [flags]``.
Single-threaded; the engine runs in a child process.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import math
import platform
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

#: modules the project imports at run time or in its tests (pyproject.toml); the device image
#: lacks some (see /work/.library/device/KINDS.md): ``env`` names the ones that fail
PROJECT_IMPORTS: tuple[str, ...] = (
    "torch", "pynvml", "opentelemetry.sdk", "opentelemetry.proto", "opentelemetry.exporter.otlp.proto.http",
    "pandas", "pyarrow", "textual", "prometheus_client", "tokenizers", "safetensors", "aiohttp", "orjson",
    "uvloop", "jinja2", "pytest", "pytest_timeout", "pytest_asyncio", "hypothesis", "openai", "jsonschema",
)


#: distributions whose versions the summary shows (the device image's may differ from CI's)
VERSIONS_OF: tuple[str, ...] = ("numpy", "pandas", "pyarrow", "aiohttp", "protobuf", "opentelemetry-sdk", "textual",
                                "nvidia-ml-py", "tokenizers", "uvloop", "pytest")


def _version(dist: str) -> str:
    from importlib import metadata

    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "absent"


def _say(line: str = "") -> None:
    print(line, flush=True)


# --- env -------------------------------------------------------------------------------------


def cmd_env(a: argparse.Namespace) -> int:
    _say(f"python {platform.python_version()} ({sys.executable}), {platform.machine()}")
    missing = []
    for name in PROJECT_IMPORTS:
        try:
            if a.quick:  # found, not imported: seconds less on a small CPU box
                if importlib.util.find_spec(name) is None:
                    raise ImportError("not found")
            else:
                importlib.import_module(name)
        except Exception as exc:  # noqa: BLE001 - any failure to import is what we report
            missing.append(f"{name} ({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''})")
    _say("project imports: all present" if not missing else f"project imports that FAIL: {'; '.join(missing)}")
    _say("versions: " + ", ".join(f"{d} {_version(d)}" for d in VERSIONS_OF))
    try:
        import torch
    except Exception as exc:  # noqa: BLE001
        _say(f"torch: not importable ({exc})")
        return 1
    _say(f"torch {torch.__version__}, CUDA build {torch.version.cuda or 'none'}, "
         f"cuda available {torch.cuda.is_available()}")
    n = torch.cuda.device_count() if torch.cuda.is_available() else 0
    _say(f"gpu_count {n}")
    for i in range(n):
        p = torch.cuda.get_device_properties(i)
        _say(f"  cuda:{i} {p.name}, {p.total_memory / 2**30:.1f} GiB, {p.multi_processor_count} SMs, "
             f"capability {p.major}.{p.minor}")
    if n:
        try:
            _say(f"nccl {'.'.join(map(str, torch.cuda.nccl.version()))}")
        except Exception as exc:  # noqa: BLE001
            _say(f"nccl: {exc}")
    return 1 if missing else 0


# --- engine ----------------------------------------------------------------------------------


def _p(dist: dict[str, Any], q: str, scale: float = 1e3) -> str:
    v = dist.get(q) if dist else None
    return "n/a" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v * scale:.2f}"


def _gpu_during(capture: Path) -> str:
    """What NVML saw while the probe ran (the probe samples it alongside with ``gpu=True``)."""
    import pandas as pd

    files = sorted((capture / "series").glob("nvml*"))
    if not files:
        return "NVML alongside the probe: no series written"
    df = pd.concat([pd.read_parquet(f) if f.suffix == ".parquet" else pd.read_csv(f) for f in files])
    parts = [f"{s} mean {df[df.series == s].value.mean():.1f} max {df[df.series == s].value.max():.1f}"
             for s in ("gpu_util_pct", "sm_util_pct", "power_w") if (df.series == s).any()]
    return f"NVML alongside the probe ({len(df)} rows): " + ("; ".join(parts) or "no utilisation series")


def cmd_engine(a: argparse.Namespace) -> int:
    from collectors.probe import LengthSpec, LoadSpec, ProbeConfig, WorkloadSpec, run_probe
    from diag.analysis import analyze_paths
    from diag.analysis.scenarios.engine_process import EngineProcess

    out = Path(a.work)
    serve_args = ["--device", a.device, "--tp", str(a.tp)]
    if a.pp > 1:
        serve_args += ["--pp", str(a.pp)]
    label = " ".join(serve_args)
    t0 = time.monotonic()
    eng = EngineProcess(serve_args, capture_dir=out / "server", start_timeout_s=a.start_timeout_s).start()
    _say(f"engine {label}: listening after {time.monotonic() - t0:.1f} s (model {eng.model or '?'})")
    try:
        cfg = ProbeConfig(eng.url, api="completions", model=eng.model or None, output=str(out / "client"),
                          load=LoadSpec(concurrency=a.concurrency, requests=a.requests, warmup_requests=2),
                          workload=WorkloadSpec(LengthSpec("fixed", a.input_tokens), LengthSpec("fixed", a.output_tokens)),
                          timeout_s=60, compat_check=False, metrics_url=eng.url, gpu=a.device == "cuda")
        res = run_probe(cfg)
    finally:
        eng.stop()
    m = res.metrics
    n_err = int(m.get("requests", {}).get("errors", 0))
    kinds = ", ".join(f"{k} x{e['count']}" for k, e in (m.get("errors") or {}).items())
    _say(f"probe: {a.requests} requests at concurrency {a.concurrency}, {a.input_tokens} in / {a.output_tokens} out; "
         f"errors {n_err}{' (' + kinds + ')' if kinds else ''}")
    _say(f"  TTFT p50 {_p(m.get('ttft_s', {}), 'p50')} ms, p99 {_p(m.get('ttft_s', {}), 'p99')} ms; "
         f"ITL p50 {_p(m.get('itl_s', {}), 'p50')} ms; {m.get('throughput', {}).get('output_tokens_per_s', float('nan')):.1f} output tok/s")
    try:
        meta = json.loads((out / "server" / "meta.json").read_text())
    except (OSError, ValueError):
        meta = {}
    eng_meta = meta.get("engine_config") if isinstance(meta.get("engine_config"), dict) else {}
    _say(f"  server capture: device {eng_meta.get('device', '?')}, dtype {eng_meta.get('dtype', '?')}, "
         f"tp {eng_meta.get('tp', '?')}, pp {eng_meta.get('pp', '-')}, cold start {meta.get('cold_start_s', {})}")
    if a.device == "cuda":
        _say(f"  {_gpu_during(out / 'client')}")
    an = analyze_paths([out / "client", out / "server"])
    d = an.diagnosis
    if d is None:
        _say("verdict: none (no diagnosis)")
        return 1
    v = d.verdict
    _say(f"verdict: {v.category} ({v.confidence:.2f}) - {v.title}")
    for f in d.findings[:3]:
        _say(f"  finding {f.category} ({f.confidence:.2f}): {f.title}")
    ok = n_err == 0 and v.category not in ("no_data",)
    return 0 if ok else 1


# --- nvml ------------------------------------------------------------------------------------


#: the series collectors/nvml.py samples (its docstring's table), by their diag.ground.stages names
NVML_SERIES: tuple[str, ...] = (
    "SERIES_HBM_USED_BYTES", "SERIES_HBM_TOTAL_BYTES", "SERIES_GPU_UTIL_PCT", "SERIES_MEM_UTIL_PCT",
    "SERIES_NVLINK_TX_BYTES_PER_S", "SERIES_NVLINK_RX_BYTES_PER_S", "SERIES_PCIE_TX_BYTES_PER_S",
    "SERIES_PCIE_RX_BYTES_PER_S", "SERIES_SM_CLOCK_MHZ", "SERIES_POWER_W", "SERIES_TEMPERATURE_C",
    "SERIES_CLOCK_EVENT_REASONS", "SERIES_DRAM_BW_UTIL_PCT", "SERIES_SM_UTIL_PCT", "SERIES_TENSOR_UTIL_PCT")


def _fmt(series: str, value: float) -> str:
    if series.endswith("_bytes"):
        return f"{value / 2**30:.2f} GiB"
    if series.endswith("_bytes_per_s"):
        return f"{value / 1e6:.3f} MB/s"
    if series == "clock_event_reasons":
        return f"0x{int(value):x}"
    return f"{value:g}"


def nvml_report(sampler: Any, df: Any, series: tuple[str, ...]) -> list[str]:
    """One line per (GPU, series): its last value, or why it is not sampled (from the sampler's
    ``not_supported``), or 'no rows' when it was neither sampled nor given up."""
    lines = []
    info = sampler.device_info()
    for gpu in info["gpus"]:
        e = gpu["entity"]
        lines.append(f"{e}: {gpu['name']} ({gpu['uuid']}), pcie source {gpu['pcie_source'] or 'none'}, "
                     f"GPM {'yes' if gpu['gpm_supported'] else 'no'}, nvlink links {gpu['nvlink_links'] or 'none'}")
        own = df[df.entity.str.split("/").str[0] == e] if len(df) else df
        reasons: dict[str, str] = gpu["not_supported"]
        for s in series:
            rows = own[own.series == s] if len(own) else own
            if len(rows):
                per = rows.groupby("entity").value.last()
                vals = ", ".join(f"{k.split('/', 1)[1] + '=' if '/' in k else ''}{_fmt(s, float(x))}" for k, x in per.items())
                lines.append(f"  {s:<24} {vals}  ({len(rows)} rows)")
            else:
                why = reasons.get(s) or next((r for k, r in reasons.items() if k.startswith(s + "[")), None)
                lines.append(f"  {s:<24} {'not sampled: ' + why if why else 'no rows (no reason recorded)'}")
        extra = {k: r for k, r in reasons.items() if k not in series and not any(k.startswith(s + "[") for s in series)}
        for k, r in extra.items():
            lines.append(f"  {k:<24} not sampled: {r}")
    return lines


def cmd_nvml(a: argparse.Namespace) -> int:
    from collectors.nvml import NvmlSampler
    from diag.ground import stages as S

    series = tuple(getattr(S, n) for n in NVML_SERIES)
    s = NvmlSampler(interval_s=0.1)
    if not s.available:
        _say(f"NVML sampler unavailable: {s.note}")
        return 1 if a.require_gpu else 0
    s.start()
    time.sleep(a.seconds)
    s.stop()
    df = s.collect()
    info = s.device_info()
    _say(f"driver {info['driver_version']}, NVML {info['nvml_version']}, {s.samples_taken} samples in {a.seconds:g} s, "
         f"sampler CPU {1e3 * s.sampler_cpu_s / max(1, s.samples_taken):.2f} ms/sample, overruns {s.overruns}")
    for w in info["warnings"]:
        _say(f"warning: {w}")
    for line in nvml_report(s, df, series):
        _say(line)
    for t in info["topology"]:
        _say(f"topology: {t}")
    return 0 if s.samples_taken >= 3 else 1


# --- scenarios -------------------------------------------------------------------------------


def gpus_needed(plan: Any) -> int:
    """The most ranks any phase of a plan starts (``--tp N`` times ``--pp M``)."""
    most = 1
    for ph in plan.phases:
        args = list(ph.serve_args)
        n = 1
        for flag in ("--tp", "--pp"):
            if flag in args:
                n *= int(args[args.index(flag) + 1])
        most = max(most, n)
    return most


def on_device(scenario: Any, device: str) -> Any:
    """The same scenario with every phase's engine on ``device``."""
    build = scenario.build

    def build_on(cal: Any) -> Any:
        plan = build(cal)
        return replace(plan, phases=tuple(replace(ph, serve_args=(*ph.serve_args, "--device", device))
                                          for ph in plan.phases))

    return replace(scenario, build=build_on)


def cmd_scenarios(a: argparse.Namespace) -> int:
    from diag.analysis.scenarios import SCENARIOS, calibrate, check, confusion_table

    t0 = time.monotonic()
    cal = calibrate(a.device)
    _say(f"calibration on {a.device} ({time.monotonic() - t0:.0f} s): prefill {cal.prefill_ms_per_token:.4f} ms/token, "
         f"decode step {cal.decode_step_ms:.2f} ms, short-prompt TTFT {cal.ttft_short_ms:.1f} ms, spread {cal.spread:.2f}")
    order = sorted(SCENARIOS, key=lambda s: not s.fast)  # fast ones first, catalogue order kept
    rows, not_reached, skipped = [], [], []
    last_s = 0.0
    for sc in order:
        need = gpus_needed(sc.build(cal))
        if need > a.gpus:
            skipped.append(f"{sc.name} (needs {need} {'GPUs' if a.device == 'cuda' else 'ranks'}, {a.gpus} here)")
            continue
        left = a.budget_s - (time.monotonic() - t0)
        if left < max(5.0, 1.5 * last_s):
            not_reached.append(sc.name)
            continue
        t1 = time.monotonic()
        try:
            (row,) = check([on_device(sc, a.device)], Path(a.work), cal)
        except Exception as exc:  # noqa: BLE001 - one scenario's failure is a row, not the end
            _say(f"  {sc.name}: FAILED {type(exc).__name__}: {' '.join(str(exc).split())[:200]}")
            rows.append(None)
            continue
        last_s = time.monotonic() - t1
        rows.append(row)
        marks = "  ".join(f"{m} {row.verdicts[m].category} {'ok' if row.ok(m) else 'MISS'}" for m in row.verdicts)
        _say(f"  {sc.name:<22} expect {row.expected:<16} {marks}  ({last_s:.0f} s)")
    done = [r for r in rows if r is not None]
    if done:
        _say(confusion_table(done))
    right = sum(r.ok(m) for r in done for m in r.verdicts)
    total = sum(len(r.verdicts) for r in done)
    _say(f"catalogue on {a.device}: {right}/{total} verdicts right over {len(done)} scenarios, "
         f"{rows.count(None)} failed; {time.monotonic() - t0:.0f} s")
    if skipped:
        _say(f"skipped: {', '.join(skipped)}")
    if not_reached:
        _say(f"not reached within {a.budget_s:.0f} s: {', '.join(not_reached)}")
    return 0 if done and right == total and None not in rows else 1


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("env").add_argument("--quick", action="store_true", help="look the project's modules up, do not import them")
    e = sub.add_parser("engine")
    e.add_argument("--device", default="cuda", choices=("cpu", "cuda"))
    e.add_argument("--tp", type=int, default=1)
    e.add_argument("--pp", type=int, default=1)
    e.add_argument("--requests", type=int, default=32)
    e.add_argument("--concurrency", type=int, default=4)
    e.add_argument("--input-tokens", type=int, default=128)
    e.add_argument("--output-tokens", type=int, default=32)
    e.add_argument("--start-timeout-s", type=float, default=120.0)
    e.add_argument("--work", required=True, help="directory for the client and server captures")
    n = sub.add_parser("nvml")
    n.add_argument("--seconds", type=float, default=1.0)
    n.add_argument("--require-gpu", action="store_true", help="exit 1 when NVML finds no GPU")
    s = sub.add_parser("scenarios")
    s.add_argument("--device", default="cuda", choices=("cpu", "cuda"))
    s.add_argument("--gpus", type=int, default=1, help="GPUs (or, on cpu, ranks) a scenario may use")
    s.add_argument("--budget-s", type=float, default=150.0, help="start no scenario after this (calibration included)")
    s.add_argument("--work", required=True, help="directory for the scenario runs")
    a = ap.parse_args(argv)
    return {"env": cmd_env, "engine": cmd_engine, "nvml": cmd_nvml, "scenarios": cmd_scenarios}[a.cmd](a)


if __name__ == "__main__":
    raise SystemExit(main())
