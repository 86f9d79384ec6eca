"""The real-vLLM matrix's draws (``vllm_draws.draw``): reproducible, and each sized so that its
configuration makes the truth it is scored against. Fast: nothing starts."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from diag.analysis.scenarios.matrix import Verdict

from vllm_draws import (ALSO_RIGHT, BLOCK_TOKENS, EXTRA_FAMILIES, FAMILIES, MIN_REQUESTS, MODES, PD_KINDS, SLACK_TOKENS,
                        VLLMDraw, draw, draws)
from vllm_matrix import VLLMDrawResult, rescore

SEEDS = (20261206, 1, 77, 4242)


def test_a_draw_is_the_same_every_time_and_differs_by_seed() -> None:
    assert draws(7, 6) == draws(7, 6)
    assert draws(7, 6) != draws(8, 6)


@pytest.mark.parametrize("seed", SEEDS)
def test_consecutive_draws_hold_every_family(seed: int) -> None:
    for start in range(0, 8):
        assert {draw(seed, i).family for i in range(start, start + len(FAMILIES))} == set(FAMILIES)


def _arg(d: VLLMDraw, flag: str) -> int:
    return int(d.server_args[d.server_args.index(flag) + 1])


@pytest.mark.parametrize("seed", SEEDS)
def test_each_family_is_sized_to_make_its_truth(seed: int) -> None:
    for d in draws(seed, 24, FAMILIES + EXTRA_FAMILIES):
        assert d.requests >= MIN_REQUESTS or d.shared_prefix
        assert d.prompt_range()[1] + d.output_tokens + SLACK_TOKENS <= d.max_model_len
        if d.family == "queue":  # more streams than the cap, answers long enough to wait for
            assert d.expected == "queue" and d.concurrency >= _arg(d, "--max-num-seqs") + 2 and d.output_tokens >= 48
        elif d.family == "kv_cache":
            usable = _arg(d, "--num-gpu-blocks-override") - 1  # vLLM's null block
            per_request = math.ceil((d.input_tokens + d.output_tokens + SLACK_TOKENS) / BLOCK_TOKENS)
            fit = usable // per_request
            assert d.expected == "kv_cache" and 1 <= fit <= 2 and d.concurrency >= fit + 2
            assert d.max_model_len == usable * BLOCK_TOKENS  # vLLM refuses a max length the pool cannot hold
        elif d.family == "prefix_cache":
            off = "--no-enable-prefix-caching" in d.server_args
            assert d.expected == ("prefix_cache" if off else "healthy") and d.concurrency == 1
            prefix, uses = (int(x) for x in d.shared_prefix.split(":"))
            assert prefix >= 16 * d.input_tokens and d.requests % (uses + 1) == 0
            assert d.diagnosable()  # diagnose's own prompts share no prefix
        elif d.family == "prefill_compute":  # long prompts, alone, spread for a prompt fit
            assert d.expected == "prefill_compute" and not d.server_args and d.concurrency == 1
            assert d.prompt_range()[0] >= 600 and d.input_spread >= 200
        elif d.family == "head_of_line":  # a long prompt's chunked prefill spans many steps of the budget
            long_tokens, every = (int(x) for x in d.inject_long.split(":"))
            assert d.expected == "head_of_line" and long_tokens >= 5 * _arg(d, "--max-num-batched-tokens")
            assert long_tokens >= 10 * d.input_tokens and d.concurrency >= 3 and d.requests >= 8 * every
            assert f"--inject-long {d.inject_long}" in " ".join(d.probe_args()) and d.prompt_range()[1] == long_tokens
            assert f"--input-tokens {d.input_tokens} " in " ".join(d.probe_args())  # the short prompts
        elif d.family == "grammar_compile":  # groups of R uses per fresh schema, R above twice the streams
            fresh = d.response_format != "schema:repeat"
            assert d.expected == ("grammar_compile" if fresh else "healthy") and not d.server_args
            if fresh:
                group = int(d.response_format.split(":")[1])
                assert group >= 2 * d.concurrency + 2 and d.requests >= 4 * group and d.schema_properties >= 80
            assert "--response-format" in d.probe_args() and ("response_format=schema" in d.diagnose_args()[-3])
            assert (d.diagnosable() is None) == fresh  # --workload cannot say the users send one schema
        elif d.family == "lora_adapters":  # more adapters than slots, or as many slots as adapters
            slots = _arg(d, "--max-loras")
            assert d.expected == ("lora_adapters" if slots < d.lora_adapters else "healthy")
            assert d.lora_adapters >= 3 and slots in (1, d.lora_adapters) and d.concurrency >= 4
            assert "--lora" in d.probe_args() and d.diagnose_args()[-1].endswith("+".join(d.adapter_names()))
        elif d.family == "pd_transfer":
            _check_pd_draw(d)
        else:
            assert d.expected == "healthy" and not d.server_args and d.concurrency <= 2 and d.input_tokens <= 192
        if d.family not in ("prefix_cache", "grammar_compile", "lora_adapters", "pd_transfer"):
            assert d.diagnosable() is None and "--max-concurrency" not in d.diagnose_args()
            lo, hi = d.prompt_range()
            assert d.diagnose_args()[-1] == f"prompt_tokens={lo}-{hi},concurrency={d.concurrency}"


def _check_pd_draw(d: VLLMDraw) -> None:
    """A P/D draw's configuration makes its truth: the decode side short of running places under more
    streams, a link in the low Mbit/s, or a roomy pair on the loopback as it is at a light load."""
    assert d.disaggregated and not d.lora_adapters and not d.response_format and not d.inject_long
    assert d.requests >= MIN_REQUESTS and not d.shared_prefix
    if "--max-num-seqs" in d.server_args:  # admission: more streams than running places, answers to wait for
        k = _arg(d, "--max-num-seqs")
        assert d.expected == "pd_transfer" and not d.link_mbit and k <= 2 and d.concurrency >= k + 2
        assert d.output_tokens >= 32 and len(d.server_args) == 2
    elif d.link_mbit:  # a slow link: at least a block of KV at a few Mbit/s
        assert d.expected == "pd_transfer" and not d.server_args and 6 <= d.link_mbit <= 24
        assert d.input_tokens >= 64 and d.concurrency <= 2
        assert "Mbit/s link" in d.setup()
    else:  # the near-miss
        assert d.expected == "healthy" and not d.server_args and d.concurrency <= 2 and d.input_tokens <= 192
    skipped = d.skipped_modes()
    assert set(skipped) == {"traces", "diagnose"} and all(skipped.values())
    assert set(MODES) - set(skipped) == {"client-only", "metrics"}


@pytest.mark.parametrize("seed", SEEDS)
def test_pd_draws_are_the_same_every_time_and_take_each_kind_in_turn(seed: int) -> None:
    alone = draws(seed, 9, ("pd_transfer",))
    assert alone == draws(seed, 9, ("pd_transfer",)) and alone != draws(seed + 1, 9, ("pd_transfer",))
    for d in alone:
        _check_pd_draw(d)
    kinds = ["admission" if d.server_args else "link" if d.link_mbit else "roomy" for d in alone]
    assert all(set(kinds[i:i + len(PD_KINDS)]) == set(PD_KINDS) for i in range(len(kinds) - 2)), kinds
    # among other families too: the family's own draws take the kinds in turn
    every = FAMILIES + EXTRA_FAMILIES
    mixed = [d for d in draws(seed, 3 * len(every), every) if d.family == "pd_transfer"]
    kinds = ["admission" if d.server_args else "link" if d.link_mbit else "roomy" for d in mixed]
    assert len(mixed) == 3 and set(kinds) == set(PD_KINDS), kinds


def test_pd_draws_leave_the_default_rotation_as_it_was() -> None:
    assert "pd_transfer" in EXTRA_FAMILIES and "pd_transfer" not in FAMILIES
    assert all(not d.disaggregated and not d.skipped_modes().get("traces") for d in draws(20261206, 8))


def test_a_client_cannot_see_disaggregation_and_the_metrics_must_name_it() -> None:
    d = next(x for x in draws(3, 6, ("pd_transfer",)) if x.expected == "pd_transfer")
    for seen in ("queue", "network", "healthy", "inconclusive"):
        assert VLLMDrawResult(d, {"client-only": Verdict(seen, 0.7, "")}).outcome("client-only") == "right"
    assert VLLMDrawResult(d, {"client-only": Verdict("kv_cache", 0.9, "")}).outcome("client-only") == "wrong"
    assert VLLMDrawResult(d, {"metrics": Verdict("queue", 0.9, "")}).outcome("metrics") == "wrong"
    assert VLLMDrawResult(d, {"metrics": Verdict("pd_transfer", 0.8, "")}).outcome("metrics") == "right"
    near = next(x for x in draws(3, 6, ("pd_transfer",)) if x.expected == "healthy")
    assert VLLMDrawResult(near, {"client-only": Verdict("network", 0.8, "")}).outcome("client-only") == "wrong"


def test_rescore_leaves_out_the_modes_a_pd_draw_is_not_scored_in(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import vllm_matrix

    d = draw(5, 0, ("pd_transfer",))
    (tmp_path / d.name / "cli").mkdir(parents=True)
    (tmp_path / d.name / "draw.json").write_text(__import__("json").dumps(vars(d)))
    seen: list[list[str]] = []
    monkeypatch.setattr(vllm_matrix, "score_captures", lambda out, modes: seen.append(list(modes)) or {})
    (r,) = rescore(tmp_path, 5).results
    assert r.draw == d and seen == [["client-only", "metrics"]] and set(r.skipped) == {"traces", "diagnose"}


def test_what_a_mode_cannot_tell_apart_is_right_and_nothing_else_is() -> None:
    d = next(x for x in draws(1, 8) if x.family == "kv_cache")
    r = VLLMDrawResult(d, {m: Verdict("queue", 0.9, "") for m in ("client-only", "traces", "metrics")})
    assert r.outcome("client-only") == r.outcome("traces") == "right"
    assert r.outcome("metrics") == "wrong"  # the KV gauges are there: a batch cap is the wrong name
    assert ALSO_RIGHT["metrics"] == {}
    r = VLLMDrawResult(d, {"metrics": Verdict("inconclusive", 0.5, "", "kv_cache", 0.6)})
    assert r.outcome("metrics") == "leading-right"


def test_rescore_reads_only_draws_of_its_seed_with_a_capture(tmp_path: Path) -> None:
    d = draw(5, 0)
    (tmp_path / d.name).mkdir()
    (tmp_path / d.name / "draw.json").write_text(__import__("json").dumps(vars(d)))
    assert rescore(tmp_path, 5).results == []  # no probe capture: not scored


def test_diagnose_json_is_read_with_its_leading_candidate() -> None:
    from vllm_matrix import _diagnose_verdict

    doc = {"analysis": {"verdict": {"category": "inconclusive", "confidence": 0.5, "title": "t"},
                        "leading_candidate": {"category": "prefill_compute", "confidence": 0.65}}}
    v = _diagnose_verdict(doc)
    assert (v.category, v.leading, v.leading_confidence) == ("inconclusive", "prefill_compute", 0.65)
    d = next(x for x in draws(1, 8) if x.family == "prefill_compute")
    assert VLLMDrawResult(d, {"diagnose": v}).outcome("diagnose") == "leading-right"
