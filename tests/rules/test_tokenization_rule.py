"""rules.tokenization: the tokenize rule's paths in their order, and the client's per-token cost
named tokenize when every request arrived alone. End-to-end verdicts on real engines are in
test_verdicts_real.py and tests/thirdparty."""

from __future__ import annotations

from rules import evidence, run_rules


def test_a_lone_streams_prompt_spread_is_a_sweep_for_the_black_box_tokenizer(tmp_path) -> None:  # noqa: ANN001
    """One stream, prompts of 64..384 tokens at 3 ms a token in the tokenizer (the r005 tokenize draw
    of seed 90417, client-only): every request arrived alone, so the spread of its prompts is a
    prompt sweep and tokenize is named; the same costs under 3 streams stay a leading candidate."""
    from support.simcap import MS, Client, Engine, Phase, simulate, tables_of

    def client_only(conc: int):  # noqa: ANN202
        dirs = simulate(tmp_path / str(conc), Engine(tok_s_per_token=3.0 * MS),
                        [Phase("steady", 30, [64, 128, 256, 384], 8, conc=conc)], Client())
        return run_rules(tables_of(dirs, ("client",)))

    lone = client_only(1)
    assert lone.verdict.category == "tokenize" and lone.verdict.black_box, lone.verdict
    rows = {e.key: e.value for e in lone.verdict.evidence}
    assert rows[evidence.FIT_ALONE_SHARE] == 1.0 and rows[evidence.SLOPE_PER_ITL] > 0.5
    crowded = next(f for f in client_only(3).findings if f.category == "tokenize")
    assert crowded.confidence < lone.verdict.confidence


def test_the_tokenize_rules_server_path_answers_before_the_clients() -> None:
    from rules.base import REGISTRY, checks_of

    assert [c.id for c in checks_of("tokenize")] == ["tokenize.spans", "tokenize.black_box"]
    assert REGISTRY["tokenize"].needs == (("tokenize_share_tail",), ("prompt_slope_per_itl", "ttft_prompt_r2"))
