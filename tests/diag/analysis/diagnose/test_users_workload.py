"""``ttft diagnose --workload``: what the users send, lengths only, parsed with one-line errors,
recorded in meta.json and read by the rules as features."""

from __future__ import annotations

from pathlib import Path

import pytest

from diag.analysis.diagnose.users_workload import UsersWorkload, parse_users_workload, ramp_prompt_tokens
from rules.features import compute_features

#: a small real client capture (the healthy sample's probe side)
CAPTURE = Path(__file__).resolve().parents[4] / "samples" / "healthy" / "client"


def test_a_spec_gives_lengths_and_the_shared_prefix() -> None:
    w = parse_users_workload("prompt_tokens=16-900, shared_prefix=512")
    assert w == UsersWorkload((16, 900), 512)
    assert w.to_meta() == {"prompt_tokens": [16, 900], "shared_prefix_tokens": 512}
    assert parse_users_workload("prompt_tokens=700") == UsersWorkload((700, 700), None)
    assert parse_users_workload("shared_prefix=0").describe() == "no shared prefix"
    assert UsersWorkload().to_meta() == {} and UsersWorkload().describe() == "not given"


@pytest.mark.parametrize("spec,says", [("prompts=5", "key one of prompt_tokens, shared_prefix"),
                                       ("prompt_tokens=900-16", "1 <= MIN <= MAX"),
                                       ("prompt_tokens=0", "1 <= MIN <= MAX"),
                                       ("shared_prefix=-3", "must be >= 0"),
                                       ("shared_prefix=lots", "whole number"),
                                       ("shared_prefix", "expected key=value")])
def test_a_bad_spec_is_one_line_naming_the_part(spec: str, says: str) -> None:
    with pytest.raises(ValueError) as exc:
        parse_users_workload(spec)
    assert says in str(exc.value) and "\n" not in str(exc.value)


def test_the_ramp_sends_the_users_prompts_when_theirs_are_shorter_and_input_tokens_always_wins() -> None:
    short, long_ = parse_users_workload("prompt_tokens=7-15"), parse_users_workload("prompt_tokens=600-900")
    assert short.typical_prompt_tokens == 11 and long_.typical_prompt_tokens == 750
    assert ramp_prompt_tokens(short, None, 64) == 11
    assert ramp_prompt_tokens(long_, None, 64) == 64  # longer prompts are the ladder's to measure
    assert ramp_prompt_tokens(short, 200, 64) == 200  # --input-tokens said
    assert ramp_prompt_tokens(None, None, 64) == 64
    assert ramp_prompt_tokens(parse_users_workload("shared_prefix=0"), None, 64) == 64


def _features(meta: dict):  # noqa: ANN202
    from dataclasses import replace

    from diag.ground.capture import load_capture
    from diag.ground.tables import build_tables

    return compute_features(replace(build_tables([load_capture(CAPTURE)]), meta=meta))


def test_the_rules_read_it_from_the_capture_meta() -> None:
    f = _features({"kind": "diagnose", "users_workload": UsersWorkload((16, 900), 0).to_meta()})
    assert f.value("designed_by_diagnose") == 1.0
    assert f.value("users_prompt_spread_x") == pytest.approx(900 / 16) and f.value("users_shared_prefix_tokens") == 0
    none = _features({"kind": "probe"})
    assert none.value("designed_by_diagnose") == 0.0
    assert not none.available("users_prompt_spread_x") and "--workload" in str(none.get("users_shared_prefix_tokens").reason)


def test_concurrency_is_the_users_load_parsed_and_recorded() -> None:
    w = parse_users_workload("prompt_tokens=100-200,concurrency=4")
    assert w == UsersWorkload((100, 200), None, 4)
    assert w.to_meta() == {"prompt_tokens": [100, 200], "concurrency": 4}
    assert w.describe() == "prompts of 100-200 tokens, up to 4 in flight"
    for spec, says in (("concurrency=0", "must be >= 1"), ("concurrency=few", "whole number of requests")):
        with pytest.raises(ValueError, match=says):
            parse_users_workload(spec)


def test_nothing_waits_is_judged_at_the_users_load(tmp_path: Path) -> None:
    """A lone-request baseline, then 12 in flight on an engine that runs 2 at a time: above the
    users' 2 in flight requests wait, at theirs nothing does. With ``concurrency=2`` the floor
    compares only the requests that arrived with at most 2 in flight, and says so."""
    import sys
    from dataclasses import replace

    from support.simcap import Engine, Phase, simulate, tables_of

    dirs = simulate(tmp_path, Engine(max_running=2),
                    [Phase("concurrency=1", 12, 64, 16, conc=1), Phase("concurrency=2", 12, 64, 16, conc=2),
                     Phase("concurrency=12", 36, 64, 16, conc=12)])
    tables = tables_of(dirs, ("client",))
    everyone = compute_features(replace(tables, meta={**tables.meta, "kind": "diagnose"}))
    theirs = compute_features(replace(tables, meta={**tables.meta, "kind": "diagnose",
                                                    "users_workload": {"concurrency": 2}}))
    assert theirs.value("users_concurrency") == 2
    assert everyone.value("ttft_over_floor_p90") > 3.0  # the ramp above them waited
    assert theirs.value("ttft_over_floor_p90") < 1.5 and "users' load (<= 2 in flight)" in theirs.get(
        "ttft_over_floor_p90").source
    assert theirs.value("ttft_floor_compared_n") < everyone.value("ttft_floor_compared_n")


def test_structured_output_and_adapters_are_said_and_recorded() -> None:
    w = parse_users_workload("response_format=schema,lora=base-a+base-b")
    assert (w.response_format, w.lora) == ("schema", ("base-a", "base-b"))
    assert w.to_meta() == {"response_format": "schema", "lora": ["base-a", "base-b"]}
    assert "JSON-schema output" in w.describe() and "base-a, base-b" in w.describe()
    for spec, says in (("response_format=xml", "one of none, json, schema"), ("lora=a+a", "each once"),
                       ("lora=a++b", "joined by +")):
        with pytest.raises(ValueError, match=says):
            parse_users_workload(spec)
