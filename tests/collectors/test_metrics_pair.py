"""``--metrics prefill=URL --metrics decode=URL``: the two instances of a disaggregated prefill/decode
pair, each its own /metrics, read as one pair: the values parsed (one URL still works; bad ones are
one line), each endpoint's rows labelled with its role by the probe's scrapers and by ``ttft scrape``
against two real ``ttft serve`` processes, and the pd features reading the split (a vLLM-like decode
instance's own compute step is not its admission)."""

from __future__ import annotations

import sys
import urllib.request
from pathlib import Path

import pandas as pd
import pytest

from collectors.prometheus import MetricsTarget, metrics_targets
from diag.ground import stages as S
from diag.cli import main
from rules.features import compute_features
from support.engine_testutil import free_port, process
from support.featcap import engine_series, make_tables


def test_one_url_or_a_prefill_decode_pair() -> None:
    assert metrics_targets(None) == [] and metrics_targets([]) == []
    assert metrics_targets("http://h:1/metrics") == [MetricsTarget("http://h:1/metrics")]
    assert metrics_targets(["http://h:1/metrics?a=b"]) == [MetricsTarget("http://h:1/metrics?a=b")]
    pair = metrics_targets(["prefill=http://h:1", "Decode=http://h:2/metrics"])
    assert pair == [MetricsTarget("http://h:1", "prefill"), MetricsTarget("http://h:2/metrics", "decode")]
    assert [t.entity for t in pair] == [S.ENTITY_ROLE_PREFILL, S.ENTITY_ROLE_DECODE]
    assert [t.source for t in pair] == ["prometheus-prefill", "prometheus-decode"]
    assert MetricsTarget("http://h:1").entity == "" and MetricsTarget("http://h:1").source == "prometheus"


@pytest.mark.parametrize(("values", "says"), [
    (["foo=http://h:1"], "unknown role 'foo' (known: prefill, decode)"),
    (["prefill=http://h:1", "prefill=http://h:2"], "a role given twice (prefill)"),
    (["prefill=http://h:1"], "decode=URL missing"),
    (["http://h:1", "http://h:2"], "2 URLs without roles"),
    (["http://h:1", "decode=http://h:2"], "a bare URL beside ROLE=URL"),
    (["decode="], "no URL after decode="),
])
def test_bad_values_are_one_line(values: list[str], says: str) -> None:
    with pytest.raises(ValueError) as err:
        metrics_targets(values)
    assert says in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("argv", [
    ["probe", "http://127.0.0.1:9", "--metrics", "foo=http://127.0.0.1:9"],
    ["diagnose", "http://127.0.0.1:9", "--metrics", "foo=http://127.0.0.1:9"],
    ["watch", "http://127.0.0.1:9", "--metrics", "foo=http://127.0.0.1:9", "-d", "1"],
    ["scrape", "foo=http://127.0.0.1:9", "-o", "unused"],
])
def test_each_command_refuses_an_unknown_role_in_one_line(argv: list[str], capsys: pytest.CaptureFixture[str],
                                                          tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "unknown role 'foo'" in err, err
    assert not (tmp_path / "unused").exists()


def _features(series: pd.DataFrame) -> dict[str, float | None]:
    f = compute_features(make_tables(series=series))
    return {k: f.value(k) for k in ("pd_metrics_decode_ttft_share", "pd_metrics_transfer_share",
                                    "pd_metrics_admission_share")}


def _pair(prefill: tuple[float, float, float], decode: tuple[float, float, float, float]) -> pd.DataFrame:
    """Two instances' windows as ``--metrics prefill=… decode=…`` labels them (TTFT, queue, prefill
    time; the decode side's transfer last): vLLM's decode instance times the transfer in its queue and
    its step computing the prompt's last token in its prefill time."""
    pre = {S.SERIES_REQUESTS_PER_S: 2.0, S.SERIES_TTFT_S: prefill[0], S.SERIES_QUEUE_TIME_S: prefill[1],
           S.SERIES_PREFILL_TIME_S: prefill[2]}
    dec = {S.SERIES_REQUESTS_PER_S: 2.0, S.SERIES_TTFT_S: decode[0], S.SERIES_QUEUE_TIME_S: decode[1],
           S.SERIES_PREFILL_TIME_S: decode[2], S.SERIES_KV_TRANSFER_S: decode[3]}
    return pd.concat([engine_series([pre] * 4, entity=S.ENTITY_ROLE_PREFILL),
                      engine_series([dec] * 4, entity=S.ENTITY_ROLE_DECODE)], ignore_index=True)


def test_a_decode_instances_own_step_and_front_end_are_not_its_admission() -> None:
    # a roomy pair as real vLLM showed it on 2 shared cores (tests/thirdparty/test_vllm_pd.py): decode TTFT 78.8 ms
    # = queue 27.9 (the 16.7 ms transfer in it) + its step 35.8 + its front end, about the prefill instance's 22.6
    fine = _features(_pair((0.0800, 0.0, 0.0574), (0.0788, 0.0279, 0.0358, 0.0167)))
    both = 0.0800 + 0.0788
    assert fine["pd_metrics_decode_ttft_share"] == pytest.approx(0.0788 / both)
    assert fine["pd_metrics_transfer_share"] == pytest.approx(0.0167 / both)
    assert fine["pd_metrics_admission_share"] == pytest.approx((0.0788 - 0.0167 - 0.0358 - 0.0226) / both)
    assert fine["pd_metrics_admission_share"] < 0.05
    # a decode instance capped at one running request: its TTFT is mostly the wait for a place
    capped = _features(_pair((0.0579, 0.0, 0.0408), (0.6724, 0.6167, 0.0244, 0.0113)))
    assert capped["pd_metrics_admission_share"] == pytest.approx((0.6724 - 0.0113 - 0.0244 - 0.0171) / 0.7303)
    assert capped["pd_metrics_admission_share"] > 0.8


def _get(url: str) -> None:
    with urllib.request.urlopen(url, timeout=10) as r:
        r.read()


@pytest.mark.slow
def test_two_real_endpoints_are_scraped_each_under_its_role(tmp_path: Path) -> None:
    """Two real ``ttft serve`` processes stand in for the two instances' /metrics endpoints: the probe
    (against the first) and ``ttft scrape`` label each endpoint's rows with its role."""
    a, b = free_port(), free_port()
    serve = [sys.executable, "-m", "diag", "serve", "--port"]
    with process([*serve, str(a)], "listening on"), process([*serve, str(b)], "listening on"):
        pa, pb = f"http://127.0.0.1:{a}", f"http://127.0.0.1:{b}"
        assert main(["probe", pa, "-d", "3", "-c", "1", "--input-tokens", "32", "--output-tokens", "4",
                     "--metrics", f"prefill={pa}", "--metrics", f"decode={pb}/metrics", "-o", str(tmp_path / "cap"),
                     "--no-progress"]) == 0
        _get(pb + "/v1/models")
        assert main(["scrape", f"prefill={pa}/metrics", f"decode={pb}/metrics", "--interval", "0.2", "-d", "1.2",
                     "-o", str(tmp_path / "scraped")]) == 0
    from diag.ground.capture import load_capture

    cap = load_capture(tmp_path / "cap")
    prom = cap.series.loc[cap.series["source"] == "prometheus"]
    by_role = {r: prom.loc[prom["entity"].astype(str).str.startswith(f"role={r}")] for r in ("prefill", "decode")}
    assert set(prom["entity"].astype(str).str.split("/").str[0]) == {"role=prefill", "role=decode"}
    # the probed instance's TTFT is under role=prefill; the idle one reports its gauges under role=decode
    assert (by_role["prefill"]["series"] == S.SERIES_TTFT_S).any()
    assert (by_role["decode"]["series"] == S.SERIES_WAITING).any()
    along = cap.meta["alongside"]
    assert along["prometheus-prefill"]["role"] == "prefill" and along["prometheus-decode"]["url"] == pb + "/metrics"
    assert {p.name for p in (tmp_path / "cap" / "series").iterdir()} >= {"prometheus-prefill.parquet",
                                                                       "prometheus-decode.parquet"}
    scraped = load_capture(tmp_path / "scraped")
    assert set(scraped.series["entity"].astype(str).str.split("/").str[0]) == {"role=prefill", "role=decode"}
    assert set(scraped.meta["prometheus_scrape"]) == {"prefill", "decode"}
