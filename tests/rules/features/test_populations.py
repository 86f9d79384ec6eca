"""rules.features.populations: the steady population without cold-start outliers."""

from __future__ import annotations

from support.featcap import make_requests, make_tables

from rules.features import compute_features


def test_cold_start_outlier_is_excluded() -> None:
    ttft = [2.0] + [0.01 + 0.001 * (i % 3) for i in range(49)]
    feats = compute_features(make_tables(make_requests(ttft, input_tokens=[64] * 50)))
    assert feats.value("cold_start_outliers_n") == 1
    assert feats.value("cold_start_outlier_ttft_s") == 2.0
    assert feats.value("ttft_p99_s") < 0.02
    assert feats.value("requests_n") == 49


def test_the_backlog_behind_start_up_is_start_ups_too() -> None:
    # open-loop arrivals every 100 ms while the model loads for 0.8 s: the first 8 requests all
    # wait for it (not only the first max(3, 2%) the head test looks at); the rest are steady
    ttft = [0.8 - 0.1 * i + 0.02 for i in range(8)] + [0.01 + 0.001 * (i % 3) for i in range(42)]
    feats = compute_features(make_tables(make_requests(ttft, input_tokens=[64] * 50)))
    assert feats.value("cold_start_outliers_n") == 8
    assert feats.value("ttft_p95_s") < 0.02
    assert feats.value("requests_n") == 42


def test_a_slow_request_later_in_the_run_is_not_start_up() -> None:
    # one slow request after the first ones got their first tokens is the steady state's own
    ttft = [0.01 + 0.001 * (i % 3) for i in range(50)]
    ttft[20] = 0.5
    feats = compute_features(make_tables(make_requests(ttft, input_tokens=[64] * 50)))
    assert feats.value("cold_start_outliers_n") == 0
    assert feats.value("requests_n") == 50


def _first_contact(answer_s: float, sent_ns: float = 1.7e18 - 5e9) -> dict:
    return {"probe": {"first_contact": {"request": "api_detection", "sent_ns": sent_ns, "answer_s": answer_s,
                                        "output_tokens": 1}}}


def test_a_late_answer_to_the_probes_first_contact_is_start_up_the_run_never_saw() -> None:
    # the server loaded its model while answering the API detection; every run request is warm
    ttft = [0.01 + 0.001 * (i % 3) for i in range(50)]
    tables = make_tables(make_requests(ttft, input_tokens=[64] * 50), meta=_first_contact(3.0))
    feats = compute_features(tables)
    assert feats.value("cold_start_first_contact_s") == 3.0
    assert feats.value("cold_start_outliers_n") == 1
    assert abs(feats.value("cold_start_outlier_excess_s") - (3.0 - 0.011)) < 1e-6
    assert feats.value("requests_n") == 50  # not a run request: the steady population keeps them all


def test_a_prompt_first_contact_or_one_outside_the_window_is_no_start_up() -> None:
    ttft = [0.01 + 0.001 * (i % 3) for i in range(50)]
    req = make_requests(ttft, input_tokens=[64] * 50)
    warm = compute_features(make_tables(req, meta=_first_contact(0.02)))
    assert warm.value("cold_start_first_contact_s") == 0.02 and warm.value("cold_start_outliers_n") == 0
    late = make_tables(req, meta=_first_contact(3.0))
    windowed = compute_features(late, window_ns=(int(1.7e18), int(1.7e18 + 6e9)))
    assert windowed.value("cold_start_first_contact_s") is None and windowed.value("cold_start_outliers_n") == 0


def _sweep_past_the_context(record: bool):
    """A prompt sweep of 3 points, 6 requests each; the last point refused with 400s (and one 503)."""
    ttft = [0.02] * 12 + [float("nan")] * 6
    segs = ["prompt=512"] * 6 + ["prompt=1024"] * 6 + ["prompt=2048"] * 6
    errors = [None] * 12 + ["http_4xx"] * 5 + ["http_5xx"]
    meta = {"probe": {"context_limit": {"refused_segments": ["prompt=2048"], "context_limit_tokens": 2000,
                                        "refused_prompt_tokens": 2048}}} if record else {}
    return compute_features(make_tables(make_requests(ttft, segment=segs, error=errors,
                                                      input_tokens=[512] * 6 + [1024] * 6 + [2048] * 6), meta=meta))


def test_refusals_at_a_recorded_context_limit_are_not_failures() -> None:
    feats = _sweep_past_the_context(record=True)
    # the 400s at the point the probe chose past the context are its limit; the 503 is still a failure
    assert feats.value("context_limit_refused_n") == 5 and feats.value("context_limit_tokens") == 2000
    assert feats.value("errors_by_kind") == {"http_5xx": 1}
    assert feats.value("requests_total_n") == 13 and feats.value("error_rate") == 1 / 13
    assert feats.value("error_rate_by_segment") == {"prompt=2048": 1.0}


def test_the_same_refusals_without_a_recorded_limit_are_failures() -> None:
    feats = _sweep_past_the_context(record=False)
    assert feats.value("context_limit_refused_n") is None
    assert feats.value("errors_by_kind") == {"http_4xx": 5, "http_5xx": 1} and feats.value("error_rate") == 6 / 18


def test_requests_the_probe_lost_are_neither_failures_nor_measured():
    # a Ray worker that died with two requests in flight (worker_lost), one cut by the run's end
    ttft = [0.02] * 10 + [float("nan")] * 4
    errors = [None] * 10 + ["worker_lost", "worker_lost", "cancelled", "http_5xx"]
    f = compute_features(make_tables(make_requests(ttft, error=errors)))
    assert f.value("requests_lost_by_probe_n") == 3
    assert f.value("requests_failed_n") == 1 and f.value("requests_total_n") == 11
    assert f.value("errors_by_kind") == {"http_5xx": 1}
