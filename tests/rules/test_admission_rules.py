"""head_of_line and kv_reservation on real bundled-engine captures (server spans), each against
its near-miss: the same load with the admission policy that frees it.

Slow: each case runs the tiny model in-process for a few seconds under a closed loop.
"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from diag.ground.capture import load_capture
from diag.bundled_engine import build_engine
from diag.bundled_engine.outputs import SyncEventStream
from diag.bundled_engine.sampler import SamplingParams
from diag.analysis.report.text import format_diagnosis
from diag.ground.tables import build_tables
from rules import Diagnosis, evidence, run_rules

pytestmark = pytest.mark.slow

#: five short prompts, then a long one, cycled: the long prompt is a sixth of the requests
MIX = [(16, 8)] * 5 + [(900, 2)]


def _send(eng, i: int, n: int, mx: int, given: bool = True) -> None:
    """Request ``i``: an ``n``-token prompt, ``mx`` tokens out; wait for its end."""
    s = SyncEventStream()
    eng.submit(s.push, SamplingParams(max_tokens=mx, ignore_eos=True, temperature=0.0),
               prompt_ids=[(13 * k + i) % 300 + 1 for k in range(n)], max_tokens_given=given)
    while not s.get(120).finished:
        pass


def _run(tmp: Path, prompts: list[tuple[int, int]], conc: int, total: int, given: bool = True, **cfg) -> Diagnosis:
    """``conc`` closed-loop clients send ``total`` requests (prompt tokens, max_tokens cycled) to an
    in-process engine tracing into ``tmp``; the diagnosis of its capture."""
    eng = build_engine(model="tiny", capture_dir=str(tmp), **cfg)
    lock, it = threading.Lock(), iter(range(total))

    def client() -> None:
        while True:
            with lock:
                i = next(it, None)
            if i is None:
                return
            _send(eng, i, *prompts[i % len(prompts)], given=given)

    try:
        threads = [threading.Thread(target=client) for _ in range(conc)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
    finally:
        eng.shutdown()
    return run_rules(build_tables([load_capture(tmp)]))


def test_a_long_prompt_always_unfinished_is_still_head_of_line(tmp_path: Path) -> None:
    # a long prompt every third request at 16-token chunks: one is always in prefill, so no short
    # request runs without one ahead (no control group); server-side the comparison is the short
    # requests' own TTFT less their queue wait, with the chunk budget taken in the waiting steps
    d = _run(tmp_path, [(16, 4), (16, 4), (600, 2)], 4, 36, policy="chunked", chunk_size=16, max_context=1024)
    assert d.verdict.category == "head_of_line", format_diagnosis(d)
    rows = {e.key: e for e in d.verdict.evidence}
    assert rows[evidence.HOL_TTFT_X_NO_QUEUE].crossed
    assert rows[evidence.PREFILL_BOUND_STEPS].crossed


def test_chunked_without_a_cap_is_head_of_line(tmp_path: Path) -> None:
    # the running long prompt's chunks take the whole chunk budget: short prompts behind it wait
    d = _run(tmp_path, MIX, 4, 36, policy="chunked", chunk_size=32, max_context=1024)
    assert d.verdict.category == "head_of_line", format_diagnosis(d)
    rows = {e.key for e in d.verdict.evidence}
    assert {evidence.HOL_TTFT_X, evidence.HOL_QUEUED_STEPS} <= rows
    # in the terms of the engine the capture came from (the bundled one), not every engine's
    assert any("--max-partial-prefills" in c and "--admission skip-blocked" in c for c in d.verdict.next_checks)
    assert not any("--max-num-partial-prefills" in c for c in d.verdict.next_checks)
    assert not any(f.category == "kv_reservation" for f in d.findings)


def test_chunked_with_the_partial_prefill_cap_is_not(tmp_path: Path) -> None:
    d = _run(tmp_path, MIX, 4, 36, policy="chunked", chunk_size=32, max_context=1024, max_partial_prefills=4)
    assert not any(f.category == "head_of_line" for f in d.findings), format_diagnosis(d)
    assert any(p.rule_id == "head_of_line" for p in d.passed)


def test_reserving_the_context_for_each_request_is_kv_reservation(tmp_path: Path) -> None:
    # no max_tokens: each request reserves the 512-token context (32 blocks) of a 64-block cache,
    # so two run while eight are sent and KV usage stays under 10%
    d = _run(tmp_path, [(32, 16)], 8, 32, given=False, kv_admission="reserve", kv_blocks=64, max_context=512)
    assert d.verdict.category == "kv_reservation", format_diagnosis(d)
    assert d.features.value("kvr_kv_usage_while_waiting_p95") <= 0.2
    assert any("--kv-admission on-demand" in c for c in d.verdict.next_checks)
    assert not any("capacity_scheduler_policy" in c for c in d.verdict.next_checks)  # a TensorRT-LLM knob
    queue = [f for f in d.findings if f.category == "queue"]
    assert all("kv_reservation" in f.demoted_by for f in queue)
    # the same capture without the engine's running cap (an engine that does not say it): two running
    # while requests wait is the most that ever ran, as under a cap of two -- no finding, the experiment
    tables = build_tables([load_capture(tmp_path)])
    tables.meta = {k: v for k, v in (tables.meta or {}).items() if k != "engine_config"}
    blind = run_rules(tables)
    assert not any(f.category == "kv_reservation" for f in blind.findings), format_diagnosis(blind)
    why = next(p.reason for p in blind.passed if p.rule_id == "kv_reservation")
    assert "cap is unknown" in why and "small max_tokens" in why


def test_on_demand_with_the_same_load_is_not(tmp_path: Path) -> None:
    d = _run(tmp_path, [(32, 16)], 8, 32, given=False, kv_admission="on-demand", kv_blocks=64, max_context=512)
    assert not any(f.category in ("kv_reservation", "head_of_line") for f in d.findings), format_diagnosis(d)


def _probe_client_only(tmp: Path, engine_args: list[str]) -> Diagnosis:
    """``ttft serve`` probed with short prompts and ``--inject-long 900:6`` at concurrency 4; the
    diagnosis of the client's capture alone."""
    import re
    import sys

    from collectors.probe import LengthSpec, LoadSpec, ProbeConfig, WorkloadSpec, run_probe

    from support.engine_testutil import serve_process

    launch = ("import argparse, sys; from diag.cli.commands import serve; p = argparse.ArgumentParser(prog='ttft'); "
              "sub = p.add_subparsers(); serve.add_parser(sub); sys.exit(serve.run(p.parse_args(sys.argv[1:])))")
    cmd = [sys.executable, "-c", launch, "serve", "--port", "0", "--threads", "1", "--max-context", "1024",
           *engine_args]
    with serve_process(cmd) as (proc, line):
        m = re.search(r"(http://127\.0\.0\.1:\d+)", line)
        assert m, (line, proc.stderr.read() if proc.poll() is not None else "")
        wl = WorkloadSpec(LengthSpec.parse("16"), LengthSpec.parse("8"), inject_long_tokens=900, inject_long_every=6)
        run_probe(ProbeConfig(m.group(1), load=LoadSpec(concurrency=4, requests=42, warmup_requests=2), workload=wl,
                              timeout_s=60, output=tmp / "cli"))
    return run_rules(build_tables([load_capture(tmp / "cli")]))


def test_client_only_the_injected_long_prompt_shows_head_of_line(tmp_path: Path) -> None:
    d = _probe_client_only(tmp_path, ["--policy", "chunked", "--chunk-size", "32"])
    assert d.verdict.category == "head_of_line" and d.verdict.black_box, format_diagnosis(d)
    assert not any(f.category == "network" for f in d.findings), format_diagnosis(d)  # the waits are no latency
    near = _probe_client_only(tmp_path / "cap", ["--policy", "chunked", "--chunk-size", "32",
                                                 "--max-partial-prefills", "4"])
    assert not any(f.category == "head_of_line" for f in near.findings), format_diagnosis(near)


def _burst(tmp: Path, admission: str) -> Diagnosis:
    """SGLang's case (sgl-project/sglang#22831) in small: eight short requests alone, then a burst of
    long (600 tokens, 30 out) and short (16, 4) prompts, two shorts per long. 56 blocks of 16: one
    long holds 40, the next long cannot fit beside it, a short always can."""
    import time

    eng = build_engine(model="tiny", capture_dir=str(tmp), admission=admission, kv_blocks=56, block_size=16,
                       max_context=1024)

    try:
        for i in range(8):
            _send(eng, i, 16, 4)
        threads = []
        for w in range(8):
            for j, (n, mx) in enumerate(((600, 30), (16, 4), (16, 4))):
                t = threading.Thread(target=_send, args=(eng, 100 + 3 * w + j, n, mx))
                t.start()
                threads.append(t)
                time.sleep(0.002)  # in this order
        for t in threads:
            t.join(120)
    finally:
        eng.shutdown()
    return run_rules(build_tables([load_capture(tmp)]))


def test_a_blocked_long_head_under_fcfs_is_head_of_line(tmp_path: Path) -> None:
    d = _burst(tmp_path, "fcfs")
    assert d.verdict.category == "head_of_line", format_diagnosis(d)
    assert d.features.value("hol_blocked_kv_usage_max") < 0.9  # KV had room for the short ones
    near = _burst(tmp_path / "skip", "skip-blocked")  # they pass the blocked head: no wait behind it
    assert not any(f.category == "head_of_line" for f in near.findings), format_diagnosis(near)
