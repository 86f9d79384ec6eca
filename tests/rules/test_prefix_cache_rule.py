"""The ``prefix_cache`` rule: repeats of a shared prefix prefilled again, told from a cache that hits,
from a TTFT the prefix's prefill does not drive, and from a capture that cannot tell.

Fast cases write captures through the real span helpers and the probe's own span writer
(``record_result_on_span``) from a cost model: TTFT = fixed part + per-token cost x tokens the
server computes (prompt minus cached). The slow case runs the real server under the real probe.
"""

from __future__ import annotations

import re
import sys
import time
from pathlib import Path

import pytest

from collectors.probe.results import RequestResult, record_result_on_span
from collectors.spans import setup_tracing
from diag.ground import stages
from diag.ground.capture import load_capture
from diag.analysis.report.text import format_diagnosis
from diag.ground.tables import build_tables
from rules import evidence, run_rules

NS = 1_000_000_000
PREFIX, SUFFIX = 512, 64


def _capture(path: Path, *, fixed_s: float, per_token_s: float, hit: bool, server: bool, roles: bool = True,
             groups: int = 6, repeats: int = 3, engine_config: dict | None = None, kind: str | None = None) -> Path:
    """Groups of (first, repeat x (repeats - 1), control) requests one after another (concurrency 1).

    ``hit``: repeats' prefix is served from the cache (not computed). ``server``: the server's spans
    (queue, prefill, cached tokens) joined to the client's; else the client's alone. ``kind``: the
    capture's kind in meta.json (``diagnose``: ttft diagnose's own design).
    """
    sink = setup_tracing("probe", capture_dir=path, export_interval_s=60)
    srv = setup_tracing("engine", capture_dir=path / "server", export_interval_s=60) if server else None
    t = time.time_ns() - 3600 * NS
    k = 0
    for g in range(groups):
        for pos in range(repeats + 1):
            role = "control" if pos == repeats else ("first" if pos == 0 else "repeat")
            prompt = SUFFIX if role == "control" else PREFIX + SUFFIX
            cached = PREFIX if (hit and role == "repeat") else 0
            prefill_s = per_token_s * (prompt - cached)
            ttft_s = fixed_s + prefill_s
            res = RequestResult(f"c{k}", scheduled_ns=t, start_ns=t, sent_ns=t + 100_000, input_tokens_est=prompt,
                                usage_input_tokens=prompt, usage_output_tokens=4,
                                prefix_tokens=0 if role == "control" else PREFIX,
                                prefix_role=role if roles else None)
            first = t + int(ttft_s * NS)
            res.first_content_ns = first
            res.token_times_ns = [first + i * 5_000_000 for i in range(4)]
            res.last_ns = res.token_times_ns[-1]
            span = sink.start_request(f"c{k}", model="m", start_ns=t, side="client")
            record_result_on_span(span, res)
            if srv is not None:
                s0 = t + int(fixed_s / 2 * NS)
                r = srv.start_request(f"s{k}", model="m", start_ns=s0, traceparent=span.traceparent(),
                                      attributes={stages.GEN_AI_USAGE_INPUT_TOKENS: prompt})
                q1 = s0 + 200_000
                r.record_stage(stages.QUEUE, s0, q1)
                p1 = q1 + int(prefill_s * NS)
                r.record_stage(stages.PREFILL, q1, p1)
                f_srv = first - int(fixed_s / 4 * NS)
                for i in range(4):
                    r.add_token_time(f_srv + i * 5_000_000)
                attrs = {stages.GEN_AI_USAGE_OUTPUT_TOKENS: 4}
                if engine_config is None or engine_config.get("prefix_caching"):
                    attrs[stages.GEN_AI_USAGE_CACHED_TOKENS] = cached
                r.set_attributes(attrs)
                r.end(end_ns=f_srv + 15_000_000)
                srv.record_step(q1, p1, {stages.ATTR_STEP_PREFILL_TOKENS: prompt - cached, stages.ATTR_STEP_DECODE_SEQS: 0,
                                         stages.ATTR_STEP_WAITING: 0, stages.ATTR_STEP_RUNNING: 1})
            t = res.last_ns + 2_000_000
            k += 1
    if srv is not None:
        if engine_config is not None:
            srv.set_meta(engine="bundled", engine_config=engine_config)
        srv.shutdown()
    if kind is not None:
        sink.set_meta(kind=kind)
    sink.shutdown()
    return path


def _diagnose(*paths: Path):
    return run_rules(build_tables([load_capture(p) for p in paths]))


def _find(d, rule_id: str = "prefix_cache"):
    return next((f for f in d.findings if f.rule_id == rule_id), None)


def _passed(d, rule_id: str = "prefix_cache") -> str:
    return next(p.reason for p in d.passed if p.rule_id == rule_id)


def _rows(f) -> dict[str, object]:
    return {e.key: e for e in f.evidence}


def test_client_only_repeats_that_cost_a_first_use_are_named(tmp_path):
    d = _diagnose(_capture(tmp_path / "c", fixed_s=0.010, per_token_s=0.0004, hit=False, server=False))
    f = _find(d)
    assert f is not None and d.named == "prefix_cache", format_diagnosis(d)
    rows = _rows(f)
    saving = rows[evidence.PREFIX_SAVING]
    assert saving.crossed and abs(saving.value) < 0.05  # repeats saved nothing of the prefix
    cost = rows[evidence.PREFIX_COST_SHARE]
    assert cost.crossed and cost.value == pytest.approx(0.2048 / 0.2456, rel=0.05)
    assert f.black_box and f.confidence < 0.8
    # client-only: which engine is unknown, so every engine's switch is named
    checks = " ".join(f.next_checks)
    for word in ("--enable-prefix-caching", "cache_prompt", "--disable-radix-cache", "enable_block_reuse", "timestamp"):
        assert word in checks
    # the share explained is what repeats pay above a control
    assert f.explained_pct == pytest.approx(100 * (0.2456 - 0.0356) / 0.2456, rel=0.05)


def test_diagnose_own_prefix_is_conditional_and_weighed_as_a_designed_test(tmp_path):
    """The same repeats sent by ttft diagnose: how the server treats a repeated prefix is measured
    by design (designed_scale, not the black-box scale), but that the users' prompts repeat one is
    not (own_test_scale), so the finding is conditional."""
    found = _find(_diagnose(_capture(tmp_path / "p", fixed_s=0.010, per_token_s=0.0004, hit=False, server=False)))
    d = _diagnose(_capture(tmp_path / "d", fixed_s=0.010, per_token_s=0.0004, hit=False, server=False,
                           kind="diagnose"))
    f = _find(d)
    assert f is not None and f.conditional and "diagnose's own test" in f.note, format_diagnosis(d)
    g, pc = d.thresholds["general"], d.thresholds["prefix_cache"]
    assert g["designed_scale"] > g["black_box_scale"]
    assert f.confidence == pytest.approx(found.confidence * g["designed_scale"] / g["black_box_scale"]
                                         * pc["own_test_scale"], abs=0.002)


@pytest.mark.parametrize("shared", [512, 0])
def test_diagnose_with_the_users_workload_judges_the_prefix_for_their_prompts(tmp_path, shared):
    """--workload shared_prefix=N: the users' prompts share one, so the finding is theirs (not
    conditional); shared_prefix=0: theirs share none, so no cache finding at all."""
    from dataclasses import replace

    tables = build_tables([load_capture(_capture(tmp_path / "d", fixed_s=0.010, per_token_s=0.0004, hit=False,
                                                 server=False, kind="diagnose"))])
    d = run_rules(replace(tables, meta={**tables.meta, "users_workload": {"shared_prefix_tokens": shared}}))
    if shared:
        f = _find(d)
        assert f is not None and not f.conditional and d.verdict.rule_id == "prefix_cache", format_diagnosis(d)
    else:
        assert _find(d) is None and "your prompts share none" in _passed(d)


def test_client_only_cache_that_hits_is_a_near_miss(tmp_path):
    d = _diagnose(_capture(tmp_path / "c", fixed_s=0.010, per_token_s=0.0004, hit=True, server=False))
    assert _find(d) is None
    assert "the cache hits" in _passed(d) and d.verdict.rule_id != "prefix_cache"


def test_prefill_that_does_not_drive_ttft_is_not_a_cache_problem(tmp_path):
    # a 300 ms fixed part (the network, say) and a prefix that costs 5 ms: caching would save little
    d = _diagnose(_capture(tmp_path / "c", fixed_s=0.300, per_token_s=0.00001, hit=False, server=False))
    assert _find(d) is None
    assert "a cache would save little" in _passed(d)


def test_without_the_design_the_rule_is_skipped_with_the_reason(tmp_path):
    d = _diagnose(_capture(tmp_path / "c", fixed_s=0.010, per_token_s=0.0004, hit=False, server=True, roles=False))
    skip = next(s.reason for s in d.skipped if s.rule_id == "prefix_cache")
    assert skip.startswith("skipped: needs") and "--shared-prefix N:R" in skip
    assert all(p.rule_id != "prefix_cache" for p in d.passed)


def test_server_side_uncached_repeats_with_the_engine_named(tmp_path):
    cap = _capture(tmp_path / "c", fixed_s=0.010, per_token_s=0.0004, hit=False, server=True,
                   engine_config={"prefix_caching": True, "max_running": 8})
    d = _diagnose(cap, cap / "server")
    f = _find(d)
    assert f is not None and d.verdict.rule_id == "prefix_cache", format_diagnosis(d)
    rows = _rows(f)
    assert rows[evidence.PREFIX_CACHED_FRAC].value == 0.0 and rows[evidence.PREFIX_CACHED_FRAC].crossed
    assert rows[evidence.PREFILL_SHARE_TAIL].crossed
    assert rows[evidence.PREFIX_CACHING_ON].value == 1.0
    assert not f.black_box and f.confidence >= 0.7
    checks = " ".join(f.next_checks)
    assert "ttft serve --enable-prefix-caching" in checks and "cache_prompt" not in checks  # the bundled engine's terms


def test_server_side_cache_off_in_the_engine_config_counts_as_nothing_cached(tmp_path):
    cap = _capture(tmp_path / "c", fixed_s=0.010, per_token_s=0.0004, hit=False, server=True,
                   engine_config={"prefix_caching": False, "max_running": 8})
    d = _diagnose(cap, cap / "server")
    f = _find(d)
    assert f is not None and d.verdict.rule_id == "prefix_cache", format_diagnosis(d)
    assert "prefix cache off" in _rows(f)[evidence.PREFIX_CACHED_FRAC].meaning
    pc = _find(d, "prefill_compute")
    assert pc is None or "prefix_cache" in pc.demoted_by  # the misses own that prefill time


def test_server_side_cache_hits_pass(tmp_path):
    cap = _capture(tmp_path / "c", fixed_s=0.010, per_token_s=0.0004, hit=True, server=True)
    d = _diagnose(cap, cap / "server")
    assert _find(d) is None
    assert re.search(r"repeats had 100% of their shared prefix cached", _passed(d))


def _vllm_texts(queries: float, hits: float) -> list[tuple[float, str]]:
    """Two scrapes of a vLLM-style /metrics (the names the vLLM adapter reads), 10 s apart."""
    from prometheus_client import CollectorRegistry, Counter, generate_latest

    out = []
    for k, (q, h) in enumerate(((0.0, 0.0), (queries, hits))):
        reg = CollectorRegistry()
        for name, v in (("vllm:prefix_cache_queries", q), ("vllm:prefix_cache_hits", h)):
            Counter(name, "tokens", ["model_name", "engine"], registry=reg).labels("m", "0").inc(v)
        out.append((1_000.0 + 10 * k, generate_latest(reg).decode()))
    return out


@pytest.mark.parametrize("hit", [False, True])
def test_external_engine_counters_against_what_the_design_allows(tmp_path, hit):
    """Client design + a vLLM server's prefix-cache counters (no spans): a hit ratio far below what the
    repeats allow is a miss, in vLLM's terms; one near it passes."""
    from dataclasses import replace

    from collectors.prometheus import adapt_texts

    cap = _capture(tmp_path / "c", fixed_s=0.010, per_token_s=0.0004, hit=hit, server=False)
    tables = build_tables([load_capture(cap)])
    # 6 groups: 6 x 3 x 576 prompt tokens + 6 x 64; repeats' prefix 12 x 512 when the cache works
    queries = 6 * 3 * 576 + 6 * 64
    series = adapt_texts(_vllm_texts(queries, 12 * 512 if hit else 0.0), engine="vllm")
    # as ttft scrape records the engine it detected
    d = run_rules(replace(tables, series=series, meta={**tables.meta, "prometheus_scrape": {"engine": "vllm"}}))
    assert d.features.value("prefix_metrics_cached_frac") == pytest.approx(1.0 if hit else 0.0, abs=0.02)
    assert not d.features.available("prefix_repeat_cached_frac")  # the prefix_cache.metrics check answers
    f = _find(d)
    if hit:
        assert f is None and "the cache hits" in _passed(d)
        return
    assert f is not None and d.verdict.rule_id == "prefix_cache", format_diagnosis(d)
    row = _rows(f)[evidence.PREFIX_CACHED_FRAC]
    assert row.crossed and "hit ratio (metrics)" in row.meaning
    checks = " ".join(f.next_checks)
    assert "vLLM: --enable-prefix-caching" in checks and "cache_prompt" not in checks


@pytest.mark.slow
def test_real_server_and_probe_cache_off_then_on(tmp_path):
    """The real ``ttft serve`` under the real probe with ``--shared-prefix 384:3`` design: named with
    the cache off (server-side and client-only), not with it on."""
    from collectors.probe import LengthSpec, LoadSpec, ProbeConfig, WorkloadSpec, run_probe

    from support.engine_testutil import serve_process
    from support.engine_testutil import LAUNCH

    out = {}
    for on in (False, True):
        srv, cli = tmp_path / f"srv{int(on)}", tmp_path / f"cli{int(on)}"
        cmd = [sys.executable, "-c", LAUNCH, "serve", "--port", "0", "--capture", str(srv), "--threads", "1",
               "--max-context", "1024"] + (["--enable-prefix-caching"] if on else [])
        with serve_process(cmd) as (proc, line):
            m = re.search(r"(http://127\.0\.0\.1:\d+)", line)
            assert m, line
            run_probe(ProbeConfig(m.group(1), load=LoadSpec(concurrency=1, requests=16, warmup_requests=1),
                                  workload=WorkloadSpec(LengthSpec.parse("448"), LengthSpec.parse("2"),
                                                        shared_prefix_tokens=384, shared_prefix_repeats=3),
                                  timeout_s=60, output=cli))
        out[on] = (_diagnose(cli, srv), _diagnose(cli))
    (joined, client), (joined_on, client_on) = out[False], out[True]
    for d in (joined, client):
        assert d.verdict.rule_id == "prefix_cache", format_diagnosis(d)
    assert _rows(_find(joined))[evidence.PREFIX_CACHING_ON].value == 0.0
    assert _find(client).black_box
    for d in (joined_on, client_on):
        assert _find(d) is None, format_diagnosis(d)
    assert joined_on.features.value("prefix_repeat_cached_frac") >= 0.9
    assert client_on.features.value("prefix_repeat_saving_frac") >= 0.6


def test_the_checks_try_the_server_then_its_counters_then_client_timing():
    """Declared order, and on the bundled sample the server's cached tokens answer with the client
    joined (prefix cache off: nothing cached), the repeats' timing from the client alone."""
    from rules.base import REGISTRY, checks_of
    from support.rulectx import applying, capture_context

    assert [c.id for c in checks_of("prefix_cache")] == ["prefix_cache.server", "prefix_cache.metrics",
                                                         "prefix_cache.timing"]
    assert REGISTRY["prefix_cache"].needs == (("prefix_repeat_cached_frac",),
                                              ("prefix_repeat_saving_frac", "prefix_cost_share"))
    samples = Path(__file__).resolve().parents[2] / "samples" / "prefix_cache"

    def judged(*dirs: str):
        ctx = capture_context("prefix_cache", [samples / d for d in dirs])
        return applying("prefix_cache", ctx), REGISTRY["prefix_cache"].evaluate(ctx)

    applies, f = judged("client", "server-0")
    assert applies == ["prefix_cache.server", "prefix_cache.timing"]
    rows = _rows(f)
    assert list(rows)[:3] == [evidence.PREFIX_CACHED_FRAC, evidence.PREFILL_SHARE_TAIL, evidence.PREFIX_SAVING]
    assert rows[evidence.PREFIX_CACHED_FRAC].value == 0.0 and rows[evidence.PREFIX_CACHED_FRAC].crossed
    assert rows[evidence.PREFIX_CACHING_ON].value == 0.0 and not f.black_box and f.confidence == pytest.approx(0.9)

    applies, f = judged("client")
    assert applies == ["prefix_cache.timing"]
    rows = _rows(f)
    assert list(rows)[:2] == [evidence.PREFIX_SAVING, evidence.PREFIX_COST_SHARE]
    assert rows[evidence.PREFIX_SAVING].value == pytest.approx(0.249, abs=1e-3)
    assert rows[evidence.PREFIX_COST_SHARE].value == pytest.approx(0.834, abs=1e-3)
    assert f.black_box and evidence.PREFIX_CACHED_FRAC not in rows
