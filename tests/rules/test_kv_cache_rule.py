"""rules.kv_cache: kv_cache from the engine's gauges and from the client's token times, and
where each path stops short of naming it. Features in, finding or pass reason out; the end-to-end
verdicts on real engines are in test_verdicts_real.py and tests/thirdparty."""

from __future__ import annotations

from pathlib import Path

from diag.analysis import analyze_paths
from diag.ground.capture import load_capture
from diag.ground.tables import build_tables
from rules import evidence, run_rules
from rules.base import REGISTRY, RuleContext, checks_of
from support.engine_testutil import capture_rounds
from support.rulectx import applying, features_of, rule_context

kv_cache = REGISTRY["kv_cache"].evaluate

#: real vLLM 0.32, a KV pool of 2 requests under 6 streams, seen from the client: a quarter of the
#: streams stopped for over a hundred decode steps while the others streamed, TTFT p95 288 steps
EVICTING = {"requests_n": 24.0, "ttft_p95_s": 1.75, "stream_stall_frac": 0.25, "stream_stall_n": 24.0,
            "stream_stall_steps_p50": 116.0, "ttft_in_itl_steps_p95": 288.0}


def _ctx(client_only: bool = True, **features: float | None) -> RuleContext:
    return rule_context("kv_cache", features_of(features, source="client"), client_only)


def test_streams_evicted_mid_answer_name_kv_cache_from_the_client() -> None:
    out = kv_cache(_ctx(**EVICTING))
    assert not isinstance(out, str)
    assert out.black_box  # the category is the rule's, set by the runner
    rows = {e.key: e for e in out.evidence}
    assert rows[evidence.STALLED_STREAMS].crossed
    assert rows[evidence.TTFT_P95_STEPS].value == 288.0 and rows[evidence.TTFT_P95_STEPS].crossed


def test_a_stall_share_barely_past_its_threshold_is_less_sure_than_a_clear_one() -> None:
    narrow = kv_cache(_ctx(**EVICTING))
    clear = kv_cache(_ctx(**{**EVICTING, "stream_stall_frac": 0.5}))
    assert not isinstance(narrow, str) and not isinstance(clear, str)
    assert clear.confidence > narrow.confidence


def test_few_stalls_or_no_waiting_is_a_pass_reason_that_says_how_far_off() -> None:
    few = kv_cache(_ctx(**{**EVICTING, "stream_stall_frac": 0.1}))
    assert isinstance(few, str) and "10% of streams stalled" in few
    no_wait = kv_cache(_ctx(**{**EVICTING, "ttft_in_itl_steps_p95": 5.0}))
    assert isinstance(no_wait, str) and "too little to say the KV pool is full" in no_wait


def test_the_engines_gauges_need_pressure_and_its_effect_on_ttft() -> None:
    full_and_waiting = kv_cache(_ctx(False, kv_usage_p95=0.98, preemptions_total=12.0, queue_share_tail=0.9,
                                    requests_n=200.0))
    assert not isinstance(full_and_waiting, str)
    assert not full_and_waiting.black_box and full_and_waiting.confidence >= 0.7
    idle_pool = kv_cache(_ctx(False, kv_usage_p95=0.2, preemptions_total=0.0, queue_share_tail=0.9))
    assert isinstance(idle_pool, str) and "no KV pressure" in idle_pool
    nothing_waits = kv_cache(_ctx(False, kv_usage_p95=0.98, queue_share_tail=0.01))
    assert isinstance(nothing_waits, str) and "no knee and little queueing" in nothing_waits


def test_requests_waiting_for_kv_blocks_name_kv_cache_short_of_full_usage(tmp_path) -> None:
    """A real bundled engine whose KV pool holds two 200-token requests, under six at once: the
    third waits for blocks while usage stays short of full (the free blocks hold less than a prompt);
    the engine's own reason on its steps says so. A batch cap of two with plenty of KV never does."""
    def run(out, **config):
        rounds = [[(list(range(3 + r + i, 203 + r + i)), 24) for i in range(6)] for r in range(3)]
        return run_rules(build_tables(load_capture(capture_rounds(out, rounds, block_size=16, **config))))

    kv = run(tmp_path / "kv", kv_blocks=30)  # 2 x ceil(224 / 16) = 28 blocks: two fit, a third never does
    assert kv.features.value("kv_blocked_steps_frac") >= 0.5
    assert kv.features.value("kv_usage_p95") < 0.95
    assert kv.verdict.category == "kv_cache", [(f.category, f.confidence) for f in kv.findings]
    assert evidence.KV_WAIT_AFTER_STEPS in {e.key for e in kv.verdict.evidence}
    cap = run(tmp_path / "cap", max_running=2)
    assert cap.features.value("kv_blocked_steps_frac") == 0.0
    assert cap.verdict.category != "kv_cache"


SAMPLES = Path(__file__).resolve().parents[2] / "samples"
#: ttft diagnose's long ramp: at most 2 streams decode at once at long prompts, 8 at short ones (tokens held)
LONG_RAMP_TOKENS = {"long_ramp_knee_ratio": 4.0, "long_ramp_token_ratio": 4.0, "long_ramp_decode_cap": 2.0,
                    "long_ramp_short_decode_cap": 8.0, "long_ramp_prompt_tokens": 2000.0}


def _applying(ctx: RuleContext) -> list[str]:
    return applying("kv_cache", ctx)


def test_the_checks_are_tried_gauges_preemptions_stalls_long_ramp_knee() -> None:
    assert [c.id for c in checks_of("kv_cache")] == ["kv_cache.usage", "kv_cache.preemptions", "kv_cache.stalls",
                                                     "kv_cache.long_ramp", "kv_cache.knee"]
    assert REGISTRY["kv_cache"].needs == (
        ("kv_usage_p95",), ("preemptions_total",), ("stream_stall_steps_p50", "ttft_in_itl_steps_p95"),
        ("long_ramp_knee_ratio", "long_ramp_token_ratio"),
        ("ttft_knee_jump_ratio", "concurrency_flat_levels", "decode_speed_hold_ratio"))


def test_the_engines_gauges_answer_before_the_clients_knee_of_the_same_sample() -> None:
    feats = analyze_paths([SAMPLES / "kv_cache" / c for c in ("client", "server-0")]).diagnosis.features
    ctx = rule_context("kv_cache", feats, client_only=False)
    assert _applying(ctx) == ["kv_cache.usage", "kv_cache.preemptions", "kv_cache.knee"]
    out = kv_cache(ctx)
    assert not isinstance(out, str) and not out.black_box
    rows = {e.key: e for e in out.evidence}
    assert list(rows)[:3] == [evidence.KV_USAGE_P95, evidence.KV_NEAR_FULL_SHARE, evidence.KNEE_TTFT_X]
    assert rows[evidence.KV_USAGE_P95].crossed and rows[evidence.KV_USAGE_P95].value == feats.value("kv_usage_p95")
    assert evidence.DECODE_HOLD not in rows  # the client's knee reading is not asked


def test_the_client_alone_is_judged_by_its_knee() -> None:
    feats = analyze_paths([SAMPLES / "kv_cache" / "client"]).diagnosis.features
    ctx = rule_context("kv_cache", feats, client_only=True)
    assert _applying(ctx) == ["kv_cache.knee"]
    out = kv_cache(ctx)
    assert not isinstance(out, str) and out.black_box
    assert [e.key for e in out.evidence] == [evidence.KNEE_TTFT_X, evidence.DECODE_HOLD]
    assert out.evidence[0].value == feats.value("ttft_knee_jump_ratio")
    assert out.confidence <= ctx.th["bb_knee_confidence_max"]


def test_a_long_ramp_limit_in_tokens_answers_before_the_stalls_and_one_in_requests_after() -> None:
    tokens = kv_cache(_ctx(**EVICTING, **LONG_RAMP_TOKENS))
    assert not isinstance(tokens, str) and evidence.LONG_RAMP_SHIFT in {e.key for e in tokens.evidence}
    assert evidence.STALLED_STREAMS not in {e.key for e in tokens.evidence}
    requests = {**LONG_RAMP_TOKENS, "long_ramp_knee_ratio": 1.0, "long_ramp_short_decode_cap": 2.0}
    stalls = kv_cache(_ctx(**EVICTING, **requests))
    assert not isinstance(stalls, str) and evidence.STALLED_STREAMS in {e.key for e in stalls.evidence}
    # the stalls too few to name the pool: the long ramp's limit in requests answers alone
    assert kv_cache(_ctx(**{**EVICTING, "stream_stall_frac": 0.1}, **requests)) == (
        "at most 2 streams decode at once at short and long prompts alike: a limit in requests (see queue), not in "
        "KV capacity")


def test_an_unknown_usage_reads_as_missing_not_nan() -> None:
    """Preemptions known, KV usage unknown, no pressure: the pass reason says the usage is missing."""
    out = kv_cache(_ctx(client_only=False, preemptions_total=0.0, ttft_p95_s=0.2))
    assert isinstance(out, str) and out.startswith("KV usage p95 -, preemptions 0"), out
    assert "nan" not in out


def test_a_knee_without_its_decode_speed_is_a_pass_reason_not_a_crash() -> None:
    """The knee path reached without the decode-speed ratio (as the long ramp's fallback can) says
    what it lacks instead of raising."""
    from rules.kv_cache import _kv_from_knee

    out = _kv_from_knee(_ctx(concurrency_flat_levels=4.0, ttft_knee_jump_ratio=3.0, concurrency_knee=8.0))
    assert isinstance(out, str) and out.startswith("no knee: TTFT flat for 4 levels, then x3.0"), out
    assert out.endswith("per-stream decode speed x-"), out
