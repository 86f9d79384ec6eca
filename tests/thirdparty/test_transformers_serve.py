"""The probe against a real third-party server: Hugging Face ``transformers serve``."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("transformers", reason="transformers[serving] is a test dependency")

from collectors.probe import LengthSpec, LoadSpec, ProbeConfig, WorkloadSpec, run_probe  # noqa: E402
from diag.ground.capture import load_capture  # noqa: E402
from diag.ground.tables import build_tables  # noqa: E402

from hf_serve import TransformersServe, build_tiny_llama  # noqa: E402

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory):
    return build_tiny_llama(tmp_path_factory.mktemp("hf") / "tiny-llama")


@pytest.mark.parametrize("continuous_batching", [False, True], ids=["plain", "continuous-batching"])
def test_probe_runs_against_transformers_serve_as_it_is(tiny_llama, tmp_path, continuous_batching):
    with TransformersServe(tiny_llama, continuous_batching=continuous_batching) as srv:
        cfg = ProbeConfig(srv.url, api="chat", load=LoadSpec(concurrency=2, requests=6, warmup_requests=1),
                          workload=WorkloadSpec(LengthSpec.parse("32"), LengthSpec.parse("6")),
                          timeout_s=60, output=tmp_path / "cli")
        res = run_probe(cfg)
    # no flag needed: the compatibility check found the one element this server refuses
    assert res.metrics["requests"]["ok"] == 6, (res.metrics["errors"], srv.log_tail())
    compat = json.loads((tmp_path / "cli" / "meta.json").read_text())["probe"]["compat"]
    assert compat["first_status"] == 422 and compat["refused"] == ["exact_output"]
    measured = [r for r in res.results if not r.warmup]
    # usage comes in the last chunk; without min_tokens the answer may stop early, never longer
    assert all(r.token_source == "server" and 1 <= r.usage_output_tokens <= 6 for r in measured)
    # the role-only chunk comes before the forward over the prompt: TTFT does not end there
    assert all(r.first_event_ns <= r.first_content_ns for r in measured)
    req = build_tables(load_capture(tmp_path / "cli")).requests
    steady = req.loc[~req["warmup"]]
    assert len(steady) == 6 and steady["client_ttft_s"].notna().all()
