"""Client-only verdicts against a real third-party engine: Hugging Face ``transformers serve``.

Designed probes and their ground truth (issue 12 item 5): plain mode (one request at a time)
with several in flight -> ``queue``; long prompts at concurrency 1 -> ``prefill_compute``; light
load -> ``healthy``; the first requests after start -> start-up reported apart, never the
verdict. What this engine exposes and what the tool can say from it: see ``hf_serve``.
Slow: two server starts and ~1 minute of load on 2 cores.
"""

from __future__ import annotations

import pytest

pytest.importorskip("transformers", reason="transformers[serving] is a test dependency")

from collectors.probe import LengthSpec, LoadSpec, ProbeConfig, SweepSpec, WorkloadSpec, run_probe, run_sweep  # noqa: E402
from diag.ground.capture import load_capture  # noqa: E402
from diag.analysis.report.text import format_diagnosis  # noqa: E402
from diag.ground.tables import build_tables  # noqa: E402
from rules import run_rules  # noqa: E402

from hf_serve import TransformersServe, build_tiny_llama  # noqa: E402

pytestmark = pytest.mark.slow


def _config(url: str, out, load: LoadSpec, prompt: str = "32", output: str = "16") -> ProbeConfig:  # noqa: ANN001
    return ProbeConfig(url, api="chat", load=load, workload=WorkloadSpec(LengthSpec.parse(prompt), LengthSpec.parse(output)),
                       timeout_s=60, output=out)


def _diagnose(out):  # noqa: ANN001, ANN202
    return run_rules(build_tables(load_capture(out)))


@pytest.fixture(scope="module")
def small_model(tmp_path_factory):  # noqa: ANN001, ANN201
    return build_tiny_llama(tmp_path_factory.mktemp("hf") / "tiny", spaced=True)


@pytest.fixture(scope="module")
def plain_server(small_model):  # noqa: ANN001, ANN201
    """One plain-mode server for the steady cases; its first requests are the start-up case."""
    with TransformersServe(small_model) as srv:
        yield srv


def test_the_first_requests_after_start_report_start_up_apart(plain_server, tmp_path) -> None:  # noqa: ANN001
    """The first requests of a just-started server (no warm-up request, light load): whatever they
    paid is start-up, reported apart (a note), never the verdict."""
    run_probe(_config(plain_server.url, tmp_path / "cli", LoadSpec(concurrency=1, rate_rps=4.0, requests=12)))
    d = _diagnose(tmp_path / "cli")
    assert not any(f.category in ("cold_start", "queue") for f in d.findings), format_diagnosis(d)
    if d.features.value("cold_start_outliers_n"):
        assert any("not TTFT" in n for n in d.notes), d.notes


def _warm(url: str, prompt: str = "32", n: int = 16) -> None:
    """transformers serve runs its first ~20 requests several times slower than the rest (a
    start-up the client sees only as slow requests): the steady cases run after it."""
    run_probe(_config(url, None, LoadSpec(concurrency=1, requests=n), prompt=prompt, output="4"))


def test_plain_mode_with_several_in_flight_is_queue(plain_server, tmp_path) -> None:  # noqa: ANN001
    _warm(plain_server.url)
    run_probe(_config(plain_server.url, tmp_path / "cli", LoadSpec(concurrency=4, requests=28, warmup_requests=2)))
    d = _diagnose(tmp_path / "cli")
    assert d.verdict.category == "queue", format_diagnosis(d)
    assert d.verdict.black_box and not any(f.category == "healthy" for f in d.findings)


def test_light_load_is_healthy(plain_server, tmp_path) -> None:  # noqa: ANN001
    run_probe(_config(plain_server.url, tmp_path / "cli", LoadSpec(concurrency=1, rate_rps=3.0, requests=16,
                                                                    warmup_requests=2)))
    d = _diagnose(tmp_path / "cli")
    assert d.verdict.category == "healthy", format_diagnosis(d)


def test_long_prompts_at_concurrency_1_are_prefill_compute(tmp_path_factory, tmp_path) -> None:  # noqa: ANN001
    """A larger random model (prefill of 1-3k tokens costs 50-200 ms on a CPU), warmed up first:
    transformers serve's first ~20 requests run several times slower than the rest."""
    model = build_tiny_llama(tmp_path_factory.mktemp("hf-long") / "m", hidden_size=128, layers=4, spaced=True)
    with TransformersServe(model) as srv:
        _warm(srv.url, prompt="2048", n=20)
        cfg = _config(srv.url, tmp_path / "cli", LoadSpec(concurrency=1, warmup_requests=1), prompt="1024", output="4")
        run_sweep(cfg, SweepSpec("prompt", values=[1024.0, 2048.0, 3072.0], requests_per_point=5))
    d = _diagnose(tmp_path / "cli")
    assert d.verdict.category == "prefill_compute", format_diagnosis(d)
