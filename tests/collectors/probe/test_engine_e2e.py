"""End to end with the bundled engine: client and server captures join by trace id."""

from __future__ import annotations

import pytest

from collectors.probe import LengthSpec, LoadSpec, ProbeConfig, SweepSpec, WorkloadSpec, run_sweep


@pytest.mark.slow
def test_prompt_sweep_against_bundled_engine_joins_traces(tmp_path):
    engine_mod = pytest.importorskip("diag.bundled_engine.engine")
    server_mod = pytest.importorskip("diag.bundled_engine.server")
    from diag.analysis import analyze_paths
    from diag.ground.capture import load_capture

    srv, cli = tmp_path / "srv", tmp_path / "cli"
    engine = engine_mod.build_engine(capture_dir=srv, model="tiny")
    with server_mod.ServerThread(engine) as st:
        cfg = ProbeConfig(st.url, load=LoadSpec(warmup_requests=1), timeout_s=60, output=cli,
                          workload=WorkloadSpec(LengthSpec.parse("32"), LengthSpec.parse("4")))
        res = run_sweep(cfg, SweepSpec("prompt", [32, 64, 128], requests_per_point=2))
    assert res.metrics["requests"]["errors"] == 0, res.metrics["errors"]
    assert [s for s, _ in res.segments] == ["prompt=32", "prompt=64", "prompt=128"]

    client_ids = set(load_capture(cli).spans["trace_id"].astype(str))
    server_ids = set(load_capture(srv).spans["trace_id"].astype(str))
    # the compatibility check + 2 length calibrations + 3 warm-ups + 6 measured; each has the
    # server's spans too
    assert len(client_ids) == 12 and client_ids <= server_ids

    analysis = analyze_paths([cli, srv], run_rules=False)
    req = analysis.tables.requests
    both = req.loc[req["has_client"] & req["has_server"] & ~req["segment"].isin(["calibrate", "compat"])]
    assert len(both) == 9
    assert both["network_s"].notna().all() and (both["network_s"] > -0.005).all()
    assert (both["client_ttft_s"] >= both["server_ttft_s"] - 0.005).all()
    assert "network" in analysis.decomposition["stages"]
    assert set(both["segment"].dropna()) == {"prompt=32", "prompt=64", "prompt=128"}


@pytest.mark.slow
def test_prompt_sweep_past_the_bundled_engines_context_is_not_failures(tmp_path):
    engine_mod = pytest.importorskip("diag.bundled_engine.engine")
    server_mod = pytest.importorskip("diag.bundled_engine.server")
    from diag.analysis import analyze_paths
    from diag.ground.capture import load_capture

    # the default sweep runs to 4096 tokens; this engine holds 512 (prompt and output together)
    srv, cli = tmp_path / "srv", tmp_path / "cli"
    engine = engine_mod.build_engine(capture_dir=srv, model="tiny", max_context=512)
    with server_mod.ServerThread(engine) as st:
        cfg = ProbeConfig(st.url, load=LoadSpec(warmup_requests=1), timeout_s=60, output=cli,
                          workload=WorkloadSpec(LengthSpec.parse("32"), LengthSpec.parse("16")))
        res = run_sweep(cfg, SweepSpec("prompt", requests_per_point=4))
    assert res.sweep["points_run"] == ["prompt=64", "prompt=128", "prompt=256", "prompt=512"]
    limit = load_capture(cli).meta["probe"]["context_limit"]
    assert limit["refused_segments"] == ["prompt=512"] and limit["context_limit_tokens"] == 512
    assert res.metrics["requests"]["errors"] == 0 and res.metrics["requests"]["over_context"] == 4
    # the client's capture alone and joined with the engine's: the refusals are not the server's failures
    for paths in ([cli], [cli, srv]):
        d = analyze_paths(paths).diagnosis
        assert d.verdict.category != "failures" and d.features.value("error_rate") == 0, paths
        assert d.features.value("context_limit_refused_n") == 4
