"""``ttft instrument --capture SRV -- transformers serve MODEL`` on real processes: the probe's client
capture and the instrumented server's capture join into full stage decompositions."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest

pytest.importorskip("transformers", reason="transformers[serving] is a test dependency")

from collectors.probe import LengthSpec, LoadSpec, ProbeConfig, WorkloadSpec, run_probe  # noqa: E402
from diag.ground import stages  # noqa: E402
from diag.analysis import analyze_paths  # noqa: E402

from hf_serve import CB_SMALL_CACHE_ARGS, InstrumentedTransformersServe, build_tiny_llama  # noqa: E402

pytestmark = pytest.mark.slow

MEASURED = ("tokenize_s", "queue_s", "prefill_s", "sample_s", "detokenize_s")


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory):
    return build_tiny_llama(tmp_path_factory.mktemp("hf") / "tiny-llama")


@pytest.mark.parametrize("continuous_batching", [False, True], ids=["plain", "continuous-batching"])
def test_instrumented_transformers_serve_joins_every_stage(tiny_llama, tmp_path, continuous_batching):
    srv_dir, cli_dir = tmp_path / "srv", tmp_path / "cli"
    extra = CB_SMALL_CACHE_ARGS if continuous_batching else None
    with InstrumentedTransformersServe(tiny_llama, srv_dir, continuous_batching=continuous_batching,
                                       extra_args=extra) as srv:
        cfg = ProbeConfig(srv.url, api="chat", load=LoadSpec(concurrency=2, requests=6, warmup_requests=1),
                          workload=WorkloadSpec(LengthSpec.parse("32"), LengthSpec.parse("6")),
                          timeout_s=60, output=cli_dir)
        res = run_probe(cfg)
        rc = srv.stop()
    log = srv.log_tail()
    assert res.metrics["requests"]["ok"] == 6, (res.metrics["errors"], log)
    # it stopped on SIGINT (plain: the CLI says "Aborted!", exit 1) or SIGTERM (CB), never SIGKILL
    assert rc is not None and not srv.killed, (rc, log)

    meta = json.loads((srv_dir / "meta.json").read_text())
    inst = meta["instrument"]
    assert inst["target"] == "transformers" and inst["hook_errors_total"] == 0, inst
    assert "stopped_unix_s" in inst  # written by the exit path
    assert not (srv_dir / ".instrument.lock").exists()

    a = analyze_paths([cli_dir, srv_dir], run_rules=False)
    req = a.tables.requests
    joined = req.loc[req["has_server"] & req["has_client"] & ~req["warmup"]]
    assert len(joined) == 6, req[["trace_id", "has_server", "has_client", "warmup"]]
    for col in MEASURED:
        assert joined[col].notna().all() and (joined[col] >= 0).all(), (col, joined[list(MEASURED)])
    assert (joined["network_s"].notna()).all() and (joined["network_s"] >= 0).all()
    assert (joined["server_ttft_s"] <= joined["client_ttft_s"]).all()
    # the measured stages lie inside server TTFT (the CB hand-off to the event loop is in no stage)
    assert (joined[list(MEASURED)].sum(axis=1) <= joined["server_ttft_s"] + 1e-6).all()
    assert (joined["output_tokens"] >= 1).all()
    # cold start is recorded apart, never inside a request
    colds = a.tables.cold_starts
    assert "load" in set(colds["phase"])
    if continuous_batching:
        assert "warmup" in set(colds["phase"])
        steps = a.tables.steps
        assert steps.shape[0] > 0
        # each step's batch make-up: every measured request was prefilled in some step, the rest decode
        pre, toks, dec = (steps[c].fillna(0) for c in ("prefill_seqs", "prefill_tokens", "decode_seqs"))
        assert pre.sum() >= len(joined), steps[["prefill_seqs", "prefill_tokens", "decode_seqs"]].to_string()
        assert ((pre > 0) == (toks > 0)).all() and (dec > 0).any()
    else:
        assert "cold_start.warmup" in inst["unmeasured"]
    # prompt text is never recorded
    assert stages.ATTR_PROMPT_TEXT not in (srv_dir / "spans.otlp.jsonl").read_text()


def test_instrumented_transformers_serve_exports_to_an_otlp_endpoint(tiny_llama, tmp_path):
    """``--otlp URL``: the same spans reach an OTLP/HTTP receiver instead of a capture."""
    from collectors.otlp_receiver import OTLPReceiver
    from diag.ground.capture import CaptureWriter

    writer = CaptureWriter(tmp_path / "recv", meta={"command": "receive"})
    receiver = OTLPReceiver(writer.append_span_request, host="127.0.0.1", port=0)
    host, port = receiver.start()
    srv = InstrumentedTransformersServe(tiny_llama, None, ["--otlp", f"http://{host}:{port}"])
    try:
        with srv:
            cfg = ProbeConfig(srv.url, api="chat", load=LoadSpec(concurrency=1, requests=2, warmup_requests=0),
                              workload=WorkloadSpec(LengthSpec.parse("16"), LengthSpec.parse("4"), exact_output=False),
                              timeout_s=60, output=tmp_path / "cli")
            res = run_probe(cfg)
            srv.stop()
    finally:
        receiver.stop()
        writer.close()
    assert res.metrics["requests"]["ok"] == 2, srv.log_tail()
    a = analyze_paths([tmp_path / "cli", tmp_path / "recv"], run_rules=False)
    joined = a.tables.requests.loc[lambda r: r["has_server"] & r["has_client"] & ~r["warmup"]]
    assert len(joined) == 2 and joined[list(MEASURED)].notna().all().all()


def _child_pid(pid: int) -> int:
    """The engine process ``ttft instrument`` started."""
    return int(Path(f"/proc/{pid}/task/{pid}/children").read_text().split()[0])


def test_tracing_paused_by_the_toggle_signal_records_no_request_until_resumed(tiny_llama, tmp_path):
    """``--toggle-signal USR2 --paused``: requests while paused leave no span; after ``kill -USR2`` they
    are traced in full; meta.json lists the flip."""
    srv_dir = tmp_path / "srv"
    srv = InstrumentedTransformersServe(tiny_llama, srv_dir, ["--toggle-signal", "USR2", "--paused"])

    def probe(out: Path) -> dict:
        cfg = ProbeConfig(srv.url, api="chat", load=LoadSpec(concurrency=1, requests=2, warmup_requests=0),
                          workload=WorkloadSpec(LengthSpec.parse("16"), LengthSpec.parse("4"), exact_output=False),
                          timeout_s=60, output=out)
        return run_probe(cfg).metrics

    with srv:
        assert probe(tmp_path / "cli-paused")["requests"]["ok"] == 2, srv.log_tail()
        os.kill(_child_pid(srv.proc.pid), signal.SIGUSR2)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            meta = json.loads((srv_dir / "meta.json").read_text()) if (srv_dir / "meta.json").exists() else {}
            if meta.get("instrument", {}).get("tracing_on"):
                break
            time.sleep(0.05)
        assert probe(tmp_path / "cli-on")["requests"]["ok"] == 2, srv.log_tail()
        srv.stop()
    inst = json.loads((srv_dir / "meta.json").read_text())["instrument"]
    assert inst["tracing_on"] is True and [t["on"] for t in inst["toggles"]] == [True], inst
    assert inst["hook_errors_total"] == 0, inst
    paused = analyze_paths([tmp_path / "cli-paused", srv_dir], run_rules=False).tables.requests
    assert not paused.loc[paused["has_client"], "has_server"].any()
    on = analyze_paths([tmp_path / "cli-on", srv_dir], run_rules=False).tables.requests
    joined = on.loc[on["has_server"] & on["has_client"] & ~on["warmup"]]
    assert len(joined) == 2 and joined[list(MEASURED)].notna().all().all()
