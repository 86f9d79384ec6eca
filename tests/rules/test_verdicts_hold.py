"""Verdicts that hold, on captures of the cost-model simulator written through the real span
helpers. Each test pins a class of case, not its numbers:

* one load level, a server that serves one request at a time: ``queue`` leads (black box), under the
  verdict floor from one level (inconclusive, the concurrency sweep named), never healthy;
* a just-started, lightly loaded server whose first request paid a little: start-up reported
  apart, the steady verdict stands, on every repeat;
* a material share of failed requests: never healthy, the finding names the kinds;
* TTFT many decode steps long and no rule able to tell why: ``inconclusive``, with the experiment;
  lone requests (nothing waits) are ``healthy``, with the prompt sweep that splits their TTFT named.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from diag.analysis.report.text import format_diagnosis
from rules import FAILURES, INCONCLUSIVE, OUTCOMES, evidence, run_rules
from support.simcap import MS, Client, Engine, Phase, poisson, simulate, tables_of


def _diag(tmp: Path, engine: Engine, phases: list[Phase], client: Client | None = None, sides=("client",),
          seed: int = 0, slo: dict[str, float] | None = None, **kw):  # noqa: ANN001, ANN202
    dirs = simulate(tmp, engine, phases, client or Client(), seed=seed, **kw)
    return run_rules(tables_of(dirs, sides), slo=slo)


@pytest.mark.parametrize("cap,conc", [(1, 4), (1, 2), (2, 8)])
def test_one_level_closed_loop_against_a_serialising_server_is_queue(tmp_path: Path, cap: int, conc: int) -> None:
    d = _diag(tmp_path, Engine(max_running=cap), [Phase(f"concurrency={conc}", 60, 64, 16, conc=conc)])
    q = d.leading or d.verdict
    assert d.named == "queue", format_diagnosis(d)
    # one request served at a time (each stream alone, each first token after an end): as plain as a
    # sweep, the verdict; a cap of 2 lets streams overlap, but 60 first tokens each after a stream end
    # are far beyond chance: requests admitted only as others leave, the verdict too
    alone = next(e for e in q.evidence if e.key == evidence.WAITED_STREAMED_ALONE).crossed
    assert d.verdict.category == "queue" and alone == (cap == 1), format_diagnosis(d)
    assert q.black_box and "one load level" in (q.note or "")
    assert ("both signs of one-at-a-time service" if alone else "far beyond chance") in q.note
    names = {e.key for e in q.evidence}
    assert {evidence.TTFT_P50_STEPS, evidence.AFTER_END_SHARE} <= names
    assert any("--sweep concurrency" in c for c in d.verdict.next_checks)
    assert not any(f.category == "healthy" for f in d.findings)


def test_one_level_confidence_is_below_a_sweeps(tmp_path: Path) -> None:
    one = _diag(tmp_path / "one", Engine(max_running=1), [Phase("concurrency=4", 60, 64, 16, conc=4)])
    sweep = _diag(tmp_path / "sweep", Engine(max_running=1),
                  [Phase(f"concurrency={c}", 24, 64, 16, conc=c) for c in (1, 2, 4, 8)])
    assert one.named == sweep.named == "queue"
    assert (one.leading or one.verdict).confidence <= sweep.verdict.confidence


def test_open_loop_above_the_service_rate_is_queue(tmp_path: Path) -> None:
    d = _diag(tmp_path, Engine(max_running=1), [Phase("rate=25", 80, 64, 16, conc=None, arrivals_s=poisson(80, 25))])
    assert (d.verdict.category, d.named) == (INCONCLUSIVE, "queue"), format_diagnosis(d)


@pytest.mark.parametrize("conc,net_ms", [(4, 0.2), (16, 0.2), (4, 100)])
def test_a_batching_server_at_one_level_is_not_called_a_queue(tmp_path: Path, conc: int, net_ms: float) -> None:
    """Batched streams (first tokens within a step or two), or a fixed outside latency whose first
    tokens do not follow stream ends: the one-level queue test must not fire."""
    d = _diag(tmp_path, Engine(), [Phase(f"concurrency={conc}", 60, 64, 16, conc=conc)], Client(net_s=net_ms * MS))
    assert d.verdict.category != "queue", format_diagnosis(d)
    assert "queue" in {p.rule_id for p in d.passed}


def test_a_light_just_started_server_reports_start_up_apart(tmp_path: Path) -> None:
    """The failure seen: TTFT p95 of a few ms, a first request ~13 ms slower, load / warm-up spans:
    not cold_start; the steady verdict stands, start-up is a note, on every repeat."""
    verdicts = set()
    for seed in range(3):
        d = _diag(tmp_path / str(seed), Engine(cold_start_s=0.4, warmup_first_s=0.013),
                  [Phase("steady", 40, 64, 16, conc=1)], sides=("client", "server"), seed=seed)
        verdicts.add(d.verdict.category)
        assert not any(f.category == "cold_start" for f in d.findings), format_diagnosis(d)
        assert any(n.startswith("start-up 0.4") and n.endswith("not TTFT") for n in d.notes), d.notes
        assert "cold_start" in {p.rule_id for p in d.passed}
    assert verdicts == {"healthy"}


def test_a_material_first_request_penalty_is_cold_start(tmp_path: Path) -> None:
    d = _diag(tmp_path, Engine(cold_start_s=0.4, warmup_first_s=0.5), [Phase("steady", 40, 64, 16, conc=1)])
    assert d.verdict.category == "cold_start", format_diagnosis(d)
    assert d.verdict.explained_s is None


def test_a_first_request_penalty_within_the_slo_is_reported_apart(tmp_path: Path) -> None:
    d = _diag(tmp_path, Engine(cold_start_s=0.4, warmup_first_s=0.5), [Phase("steady", 40, 64, 16, conc=1)],
              slo={"ttft_p99": 5.0})
    assert d.verdict.category == "healthy", format_diagnosis(d)
    assert any("not TTFT" in n for n in d.notes)


def test_requests_that_arrived_during_start_up_make_it_the_verdict(tmp_path: Path) -> None:
    """Requests sent while the model was still loading waited for it: cold_start however small the rest."""
    from rules.base import REGISTRY
    from rules.features import Feature, Features
    from support.rulectx import rule_context

    cold_start = REGISTRY["cold_start"].evaluate

    feats = Features()
    for name, value, unit in (("requests_n", 40.0, "requests"), ("cold_start_waited_n", 2.0, "requests"),
                              ("cold_start_outliers_n", 0.0, "requests"), ("cold_start_s", 3.0, "s"),
                              ("cold_start_by_phase_s", {"load": 3.0}, "s"), ("ttft_p95_s", 0.01, "s")):
        feats.add(Feature(name, value, unit, True))
    out = cold_start(rule_context("cold_start", feats, client_only=False))
    assert not isinstance(out, str)
    assert out.evidence[0].key == evidence.COLD_WAITED and out.evidence[0].crossed


def test_a_short_run_whose_first_half_paid_the_start_up_names_it() -> None:
    """8 requests, 4 of them the first ones 90x the steady TTFT p95: the sample is all 8 requests,
    not the 4 steady ones left in the TTFT statistics, so cold_start is the verdict, not a lead."""
    from rules.base import REGISTRY
    from rules.features import Feature, Features
    from support.rulectx import rule_context

    cold_start = REGISTRY["cold_start"].evaluate

    def conf(outliers: float) -> float:
        feats = Features()
        for name, value, unit in (("requests_n", 4.0, "requests"), ("cold_start_outliers_n", outliers, "requests"),
                                  ("cold_start_outlier_excess_s", 3.4, "s"), ("cold_start_outlier_ttft_s", 3.44, "s"),
                                  ("ttft_p95_s", 0.038, "s")):
            feats.add(Feature(name, value, unit, True))
        out = cold_start(rule_context("cold_start", feats, client_only=False))
        assert not isinstance(out, str), out
        return out.confidence

    assert conf(4.0) >= 0.7
    assert conf(1.0) < conf(4.0)


def test_a_run_with_many_failed_requests_is_never_healthy(tmp_path: Path) -> None:
    """~30% failed (every 3rd request a 503): the failure finding names the kinds and the load level."""
    for sides in (("client",), ("client", "server")):
        d = _diag(tmp_path / "+".join(sides), Engine(), [Phase("concurrency=4", 60, 64, 16, conc=4)], sides=sides,
                  error_every=3)
        assert d.verdict.category == FAILURES, format_diagnosis(d)
        assert not any(f.category == "healthy" for f in d.findings)
        assert "http_503" in d.verdict.title and "concurrency=4" in d.verdict.title
        assert any(e.key == evidence.FAILED_SHARE_BY_LEVEL for e in d.verdict.evidence)
        json.dumps(d.to_dict(), allow_nan=False)


def test_a_few_failures_do_not_make_the_finding(tmp_path: Path) -> None:
    d = _diag(tmp_path, Engine(), [Phase("concurrency=4", 60, 64, 16, conc=4)], error_every=40)
    assert d.verdict.category == "healthy", format_diagnosis(d)
    assert "failures" in {p.rule_id for p in d.passed}


def test_lone_requests_many_steps_long_at_one_prompt_length_are_healthy_with_the_sweep_named(tmp_path: Path) -> None:
    """Client only, one request at a time, one prompt length, TTFT ~60 decode steps (a fixed delay):
    nothing waits, so healthy, said less surely, naming first the prompt sweep that would split the
    lone TTFT into prompt work and a fixed part."""
    d = _diag(tmp_path, Engine(), [Phase("steady", 40, 64, 16, conc=1)], Client(net_s=100 * MS))
    assert d.verdict.category == "healthy", format_diagnosis(d)
    assert d.verdict.next_checks[0].startswith("run `ttft probe URL --sweep prompt`")
    assert "ttft analyze CLIENT SERVER" in d.verdict.next_checks[0]
    rows = {e.key: e for e in d.verdict.evidence}
    assert rows[evidence.TTFT_P50_STEPS].crossed and rows[evidence.FLOOR_RATIO_P50].value < 1.5
    assert d.verdict.confidence < d.thresholds["healthy"]["floor_confidence"]


def test_inconclusive_still_reports_a_broken_slo(tmp_path: Path) -> None:
    d = _diag(tmp_path, Engine(), [Phase("steady", 40, 64, 16, conc=1)], Client(net_s=100 * MS),
              slo={"ttft_p99": 0.05})
    assert d.verdict.category == INCONCLUSIVE
    assert any(e.key == evidence.slo("ttft_p99") and e.meaning == "broken" for e in d.verdict.evidence)
    assert any("SLO is broken" in n for n in d.notes)


def test_the_same_capture_with_the_server_side_is_decided(tmp_path: Path) -> None:
    d = _diag(tmp_path, Engine(), [Phase("steady", 40, 64, 16, conc=1)], Client(net_s=100 * MS),
              sides=("client", "server"))
    assert d.verdict.category == "network"


@pytest.mark.parametrize("case", ["inconclusive", "failures"])
def test_the_outcomes_show_as_such_in_analyze_report_and_tui(tmp_path: Path, case: str, capsys) -> None:  # noqa: ANN001
    """ttft analyze (text, --json), the report (HTML, Markdown) and the TUI take the outcome as it is."""
    from diag.cli import main
    from tui import model
    from tui.sources import CaptureSource

    if case == "inconclusive":  # one level, 8 in flight against a cap of 2, 16 requests: queue leads, unsure
        dirs = simulate(tmp_path / "cap", Engine(max_running=2), [Phase("concurrency=8", 16, 64, 16, conc=8)])
    else:
        dirs = simulate(tmp_path / "cap", Engine(), [Phase("concurrency=4", 60, 64, 16, conc=4)], Client(), error_every=3)
    cap = str(dirs["client"])
    assert main(["analyze", cap]) == 0
    out = capsys.readouterr().out
    assert f"verdict: {case}" in out
    assert ("leading candidate (not sure enough to be the verdict): queue" in out) == (case == "inconclusive")
    assert main(["analyze", cap, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["verdict"]["category"] == case
    for ext in ("html", "md"):
        out = tmp_path / f"r.{ext}"
        main(["report", cap, "-o", str(out)])
        capsys.readouterr()
        assert case in out.read_text()
        assert ("leading candidate" in out.read_text()) == (case == "inconclusive")
    vm = model.build_view_model_with_rules(CaptureSource(cap).poll())
    assert vm.verdict.category == case
    assert vm.verdict.leading.startswith("leading candidate") == (case == "inconclusive")


def _gauge_ctx(waiting_at_cap: float, ttft_vs_prefill: float, queue_share: float | None = None):  # noqa: ANN202
    from rules.features import Feature, Features
    from support.rulectx import rule_context

    feats = Features()
    for name, value, unit in (("requests_n", 40.0, "requests"), ("waiting_at_cap_frac", waiting_at_cap, "share"),
                              ("ttft_vs_engine_prefill_ratio", ttft_vs_prefill, "x"), ("running_seqs_max", 1.0, "requests"),
                              ("ttft_p95_s", 1.0, "s"), ("metrics_queue_share", queue_share, "share")):
        feats.add(Feature(name, value, unit, value is not None, source="prometheus"))
    return rule_context("queue", feats, client_only=False)


def test_engine_gauges_at_one_level_name_a_queue() -> None:
    """llama.cpp / TGI style: waiting gauge up while running sits at its cap, TTFT far above the
    engine's prefill time -> queue; either sign missing -> no queue."""
    from rules.base import REGISTRY
    queue = REGISTRY["queue"].evaluate

    out = queue(_gauge_ctx(0.8, 9.0))
    assert not isinstance(out, str)
    assert [e.key for e in out.evidence][:2] == [evidence.AT_CAP_SCRAPES,
                                                   evidence.TTFT_OVER_PREFILL]
    assert isinstance(queue(_gauge_ctx(0.05, 9.0)), str)
    assert isinstance(queue(_gauge_ctx(0.8, 1.2)), str)


def test_the_gauges_with_the_engines_queue_histogram_name_a_measured_queue() -> None:
    """vLLM / SGLang style: the same gauges, and the engine's queue-time histogram measures the wait
    (72% of TTFT): the finding says so, judges that share, and is surer than the gauges alone."""
    from rules.base import REGISTRY
    queue = REGISTRY["queue"].evaluate

    inferred, measured = queue(_gauge_ctx(0.4, 27.0)), queue(_gauge_ctx(0.4, 27.0, queue_share=0.72))
    assert not isinstance(inferred, str) and not isinstance(measured, str)
    assert "queue-time histogram" in measured.title and "inferred" not in measured.note
    row = next(e for e in measured.evidence if e.key == evidence.QUEUE_SHARE_METRICS)
    assert row.crossed and row.value == 0.72
    assert measured.confidence > inferred.confidence and measured.confidence >= 0.7
    # a histogram that measures little wait does not raise the gauges' reading
    small = queue(_gauge_ctx(0.4, 27.0, queue_share=0.05))
    assert not isinstance(small, str) and small.confidence <= inferred.confidence


def test_a_knee_under_open_loop_arrivals_is_a_queue_not_a_kv_limit(tmp_path: Path) -> None:
    # the same KV-limited engine: a concurrency sweep (the client holds the count in flight)
    # shows a limit at that count; a rate sweep past its capacity shows requests waiting
    # because arrivals outrun it -- the count in flight is the queue's doing, not a limit's
    kv = Engine(kv_tokens=4 * (128 + 32))
    held = _diag(tmp_path / "c", kv, [Phase(f"concurrency={c}", 40, 128, 32, conc=c) for c in (1, 2, 4, 8, 16)])
    f = held.features
    assert f.value("starts_after_end_frac") > 0.8 and f.value("starts_after_end_control") < 0.3
    # a knee seen from the client leads, under the floor (a batch cap makes the same one)
    assert held.verdict.category == "inconclusive" and held.leading.category == "kv_cache"
    rates = (5, 10, 20, 40, 80)
    offered = _diag(tmp_path / "r", kv, [Phase(f"rate={r}", 40, 128, 32, conc=None, arrivals_s=poisson(40, r, seed=r))
                                         for r in rates])
    f = offered.features
    assert f.value("starts_after_end_frac") < f.value("starts_after_end_control") + 0.1
    assert offered.verdict.category == "queue", format_diagnosis(offered)
    kv_passed = next(p for p in offered.passed if p.rule_id == "kv_cache")
    assert "open loop" in kv_passed.reason


def test_a_lone_prefill_that_prompt_length_explains_poorly_is_still_prefill(tmp_path: Path) -> None:
    """One request at a time, long prompts, prefill 95%+ of TTFT but noisy (something else on the
    device): with no batch-mates to share its steps, the forward pass is still the request's own,
    never "healthy" because R² is low (seed 518277 draw 31: R² 0.25 at c=1 was a pass)."""
    rng = random.Random(3)
    prompts = [rng.randint(740, 1110) for _ in range(24)]
    eng = Engine(prefill_s_per_token=0.15 * MS, jitter=0.6)
    d = _diag(tmp_path, eng, [Phase("steady", 24, prompts, 4, conc=1)], sides=("client", "server"))
    assert d.features.value("ttft_prompt_r2") < 0.6, format_diagnosis(d)
    assert d.verdict.category == "prefill_compute", format_diagnosis(d)
    assert "grows with prompt length" not in d.verdict.title  # the fit did not show it


def test_inconclusive_alone_asks_for_a_prompt_sweep_first(tmp_path: Path) -> None:
    """Client only, one request at a time, long prompts whose TTFT prompt length explains only
    partly (noise): the prompts vary but the fit does not resolve them, so the lone TTFT, many decode
    steps long, vouches for nothing (rules.verdict.unsplit_spread): inconclusive, and no concurrency
    sweep can decide what a lone request waits for; the first experiment named is the prompt sweep."""
    rng = random.Random(5)
    prompts = [rng.randint(880, 1400) for _ in range(12)]
    eng = Engine(prefill_s_per_token=0.15 * MS, jitter=0.9)
    d = _diag(tmp_path, eng, [Phase("steady", 12, prompts, 4, conc=1)], seed=2)
    assert d.verdict.category == INCONCLUSIVE, format_diagnosis(d)  # the simulator is seeded: the same noise each run
    assert "--sweep prompt" in d.verdict.next_checks[0], d.verdict.next_checks


def test_one_level_cohorts_admitted_together_are_still_a_line(tmp_path: Path) -> None:
    """A cap of 3 with 12 in flight and long prompts: each cohort's first tokens come a whole
    cohort's prefill after the ends that freed it (seed 731942 draw 49: 125 ms after, against a
    90 ms window), still first tokens that follow stream ends, far beyond chance: queue."""
    eng = Engine(max_running=3, prefill_s_per_token=0.12 * MS, prefill_base_s=2 * MS)
    d = _diag(tmp_path, eng, [Phase("concurrency=12", 48, 360, 32, conc=12)])
    assert (d.verdict.category, d.named) == ("queue", "queue"), format_diagnosis(d)


def test_a_fixed_delay_longer_than_any_line_is_not_deferred_to_the_queue(tmp_path: Path) -> None:
    """Two closed-loop streams behind a 280 ms network delay, short varied prompts: first tokens can
    fall in order after stream ends by the loop's own rhythm, but TTFT is over 2x what waiting for
    the requests ahead would take: no line explains it, the fixed part is the network's (seed
    649281 draw 28 was inconclusive: the network rule deferred to a queue that refused)."""
    rng = random.Random(7)
    prompts = [rng.randint(10, 31) for _ in range(36)]
    d = _diag(tmp_path, Engine(), [Phase("concurrency=2", 36, prompts, 38, conc=2)], Client(net_s=0.14))
    assert d.features.value("ttft_inline_ratio") > 2.0
    assert (d.verdict.category, d.named) == (INCONCLUSIVE, "network"), format_diagnosis(d)


def test_a_fixed_part_measured_on_lone_requests_is_never_waiting_in_line(tmp_path: Path) -> None:
    """ttft diagnose's shape: a prompt ladder one request at a time, then a concurrency ramp, against
    a server that runs one request at a time behind a 150 ms network delay. The ramp's requests are
    served in line (a queue), but the ladder's fixed part was fitted on lone requests, with nothing
    ahead of them: it is the network's, judged against those requests' own TTFT, not deferred to
    the queue (seed 31337 draw 7 read the network delay as 'waiting in line')."""
    phases = [Phase("concurrency=1", 12, 64, 64, conc=1),
              *(Phase(f"prompt={n}", 6, n, 64, conc=1) for n in (128, 256, 512)),
              *(Phase(f"concurrency={c}", 8 * c, 64, 64, conc=c) for c in (2, 4, 8))]
    d = _diag(tmp_path, Engine(max_running=1), phases, Client(net_s=0.15))
    assert d.features.value("ttft_prompt_fit_alone_frac") >= 0.9
    net = next((f for f in d.findings if f.category == "network"), None)
    assert net is not None, format_diagnosis(d)
    row = next(e for e in net.evidence if e.key == evidence.INTERCEPT_SHARE)
    assert "lone requests" in row.meaning and row.value > 0.6
    assert net.explained_s == pytest.approx(d.features.value("ttft_prompt_intercept_ms") / 1e3)
    queue = next(f for f in d.findings if f.category == "queue")  # the ramp's line is still the queue's
    assert queue.explained_s > net.explained_s


@pytest.mark.parametrize("seed", range(8))
def test_a_fixed_part_the_prompt_fit_cannot_pin_is_not_called_network(tmp_path: Path, seed: int) -> None:
    """Eight lone requests, prompts within ±18% of ~930 tokens, TTFT scattered by half (a shared
    2-core box): extrapolated to zero tokens, the fit's intercept is anything from nothing to all of
    TTFT. CI seed 20261201 draw 6 read an intercept of 106 ± 88 ms as a network delay; unresolved,
    it names no network (the prompt sweep that would pin it is the experiment to run)."""
    rng = random.Random(seed)
    prompts = [rng.randint(760, 1100) for _ in range(8)]
    d = _diag(tmp_path, Engine(prefill_s_per_token=0.15 * MS, jitter=0.5), [Phase("steady", 8, prompts, 4, conc=1)],
              seed=seed)
    assert d.verdict.category != "network", format_diagnosis(d)
    net = next((p.reason for p in d.passed if p.rule_id == "network"), "")
    if "not resolved" in net:
        assert "--sweep prompt" in net


def test_a_network_delay_the_prompt_fit_pins_is_still_network(tmp_path: Path) -> None:
    """Eight lone requests with the same prompts behind a 300 ms network delay each way, costs
    scattered by a fifth: the intercept less two standard errors is still a hundred decode steps,
    so the fixed part is resolved and named."""
    rng = random.Random(1)
    prompts = [rng.randint(760, 1100) for _ in range(8)]
    d = _diag(tmp_path, Engine(prefill_s_per_token=0.15 * MS, jitter=0.2), [Phase("steady", 8, prompts, 4, conc=1)],
              Client(net_s=0.3), seed=1)
    # eight lone requests at a load the client happened to send: network leads, under the floor
    assert (d.verdict.category, d.named) == (INCONCLUSIVE, "network"), format_diagnosis(d)
    low = next(e for e in d.leading.evidence if e.key == evidence.INTERCEPT_LOW)
    assert 0.2 < low.value < d.features.value("ttft_prompt_intercept_ms") / 1e3


def test_a_prompt_sweep_of_lone_requests_behind_a_fixed_latency_names_it(tmp_path: Path) -> None:
    """Seed 71208 r016/r019/r023: a prompt sweep at one stream, every request behind ~250 ms no prompt
    explains. Fitted on lone requests, the fixed part is as plain as a client sees it: named (over
    the floor), where it had led at 0.68 under a directness that kept it at the floor at most."""
    d = _diag(tmp_path, Engine(prefill_s_per_token=0.05 * MS, jitter=0.05),
              [Phase(f"prompt={p}", 8, p, 16, conc=1) for p in (32, 64, 128)], Client(net_s=0.125), seed=3)
    assert d.verdict.category == "network" and d.verdict.confidence >= 0.7, format_diagnosis(d)
    assert any(e.key == evidence.INTERCEPT_STEPS and e.crossed for e in d.verdict.evidence)


def _fixed_part_ctx(hol_ratio: float | None, alone_frac: float, itl_s: float = 0.0135,  # noqa: ANN202
                    fit_itl_s: float | None = None):
    """Client only: a 236 ms prompt-fit intercept (16 decode steps, 88% of TTFT p50, resolved to
    +-6 ms) over requests that arrived with others in flight or alone, with short requests behind
    a long prompt ``hol_ratio`` x the TTFT of the others (None: no long prompts among them)."""
    from rules.features import Feature, Features
    from support.rulectx import rule_context

    feats = Features()
    for name, value, unit in (("requests_n", 37.0, "requests"), ("ttft_prompt_intercept_ms", 236.0, ""),
                              ("ttft_prompt_intercept_se_ms", 6.0, ""), ("ttft_prompt_slope_ms_per_token", 0.05, ""),
                              ("ttft_prompt_r2", 0.7, "share"), ("ttft_mean_s", 0.30, "s"), ("itl_p50_s", itl_s, "s"),
                              ("ttft_prompt_fit_itl_p50_s", fit_itl_s, "s"),
                              ("ttft_p50_s", 0.267, "s"), ("ttft_p95_s", 0.6, "s"),
                              ("ttft_prompt_fit_alone_frac", alone_frac, "share"),
                              ("hol_short_ttft_ratio", hol_ratio, "x")):
        feats.add(Feature(name, value, unit, value is not None))
    return rule_context("network", feats, client_only=True)


def test_short_prompts_waiting_behind_long_ones_are_no_fixed_latency() -> None:
    """CI seed 20261201 draw 0 (closed loop of 5, 8-token prompts with long ones injected, chunked)
    named network twice client-only: the short prompts' waits behind the long ones pulled the
    prompt fit's intercept up to 236 ms. Waiting is head-of-line's, not a latency outside the server;
    on lone requests (ttft diagnose's ladder) or without long prompts the same fixed part is one."""
    from rules.base import REGISTRY

    network = REGISTRY["network"].evaluate

    out = network(_fixed_part_ctx(12.6, 0.03))
    assert isinstance(out, str) and "see head_of_line" in out
    assert not isinstance(network(_fixed_part_ctx(None, 0.03)), str)
    assert not isinstance(network(_fixed_part_ctx(1.2, 0.03)), str)
    assert not isinstance(network(_fixed_part_ctx(12.6, 1.0)), str)


def test_the_fixed_part_is_counted_in_the_decode_steps_of_the_requests_it_was_fitted_on() -> None:
    """Seed 20261203 r014: 151 ms of network delay, ITL 10 ms alone but 20 ms over the whole capture
    (ttft diagnose's ramp batches 16 streams a step). The fixed part is an intercept over lone
    requests: in their decode steps it is 17 long, a latency outside the engine; in the ramp's, 8.6,
    and the rule had passed it as nothing standing out."""
    from rules.base import REGISTRY

    network = REGISTRY["network"].evaluate

    assert isinstance(network(_fixed_part_ctx(None, 1.0, itl_s=0.030)), str)  # no lone-request ITL known
    assert not isinstance(network(_fixed_part_ctx(None, 1.0, itl_s=0.030, fit_itl_s=0.0135)), str)


def test_a_knee_seen_from_the_client_alone_leads_but_is_never_the_verdict() -> None:
    """TTFT flat to 4 in flight, then 25x, decode speed held (real vLLM --max-num-seqs 3 under ttft
    run_rules, which named kv_cache at 0.75): a batch cap makes the same knee, so it stays under the floor."""
    from rules.base import REGISTRY
    from rules.features import Feature, Features
    from rules.verdict import VERDICT_FLOOR
    from support.rulectx import rule_context

    feats = Features()
    for name, value in (("requests_n", 60.0), ("ttft_p95_s", 0.9), ("concurrency_flat_levels", 2.0),
                        ("decode_speed_hold_ratio", 0.81), ("ttft_knee_jump_ratio", 25.0), ("concurrency_knee", 4.0),
                        ("designed_by_diagnose", 1.0)):
        feats.add(Feature(name, value, "", True, source="client"))
    # diagnose's designed sweep (where this knee read 0.75): the cap is what holds it under
    kv_cache = REGISTRY["kv_cache"].evaluate
    ctx = rule_context("kv_cache", feats, client_only=True)
    out = kv_cache(ctx)
    assert not isinstance(out, str) and out.black_box and "max_num_seqs" in out.note
    assert out.confidence == pytest.approx(ctx.th["bb_knee_confidence_max"])
    assert out.confidence < VERDICT_FLOOR
