"""``ttft diagnose`` against a real third-party engine: Hugging Face ``transformers serve`` in plain
mode (one request at a time; tests/thirdparty/hf_serve.py: a tiny random Llama built locally, no
hub access). As a new user would run it: no warm-up of our own, the compatibility check finds
that the server refuses ``min_tokens``/``ignore_eos`` (HTTP 422) and goes on without them.

Slow: one server start and ~30 s of probing on 2 cores.
"""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("transformers", reason="transformers[serving] is a test dependency")

from diag.analysis import analyze_paths
from diag.analysis.diagnose import DiagnoseConfig, PlanConfig, format_result, run_diagnose
from diag.analysis.report.text import format_analysis

from hf_serve import TransformersServe, build_tiny_llama

pytestmark = pytest.mark.slow


def test_plain_transformers_serve_is_queue_within_the_budget(tmp_path: Path) -> None:
    model = build_tiny_llama(tmp_path / "tiny", spaced=True)
    with TransformersServe(model) as srv:
        res = run_diagnose(DiagnoseConfig(srv.url, tmp_path / "cap", PlanConfig(budget_s=120), api="chat"))
    print(format_result(res, format_analysis(res.analysis) if res.analysis else None))
    d = res.analysis.diagnosis
    # one request at a time, seen from the client: TTFT rising with the requests in flight while
    # decode speed holds. The queue rule names it; on this server's noisy first requests (a loaded
    # 2-core box) the curve 1 -> 2 -> 4 can also read as a sharp knee past 1 in flight, which the
    # rules name an admission limit (kv_cache, black box: "the same knee comes from a max_num_seqs
    # limit") -- right for a server that admits one. Seen in 1 of 4 runs. Never healthy, never a
    # prompt-side or network verdict.
    assert d.named in ("queue", "kv_cache"), d.verdict.title
    assert not any(f.category == "healthy" for f in d.findings)
    assert any("refuses min_tokens/ignore_eos" in n for n in res.notes), res.notes
    assert [r.step.stage for r in res.records][:2] == ["baseline", "ladder"]
    assert any(r.step.kind == "concurrency" for r in res.records)
    assert res.probing_s <= 120 and res.time_to_verdict_s is not None
    assert analyze_paths([res.capture]).diagnosis.named == d.named
