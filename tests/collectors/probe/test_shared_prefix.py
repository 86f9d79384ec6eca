"""``--shared-prefix N:R``: groups of a fresh prefix, its repeats and a control; roles on the client spans."""

from __future__ import annotations

from pathlib import Path

import pytest

from collectors.probe.workload import LengthSpec, TokenCounter, Workload, WorkloadError, WorkloadSpec
from diag.ground import stages

TOKENIZER = Path(__file__).resolve().parents[3] / "diag" / "bundled_engine" / "data" / "tokenizer.json"


def test_groups_share_a_fresh_prefix_then_a_control_of_the_suffix_alone():
    tok = TokenCounter(TOKENIZER)
    w = Workload(WorkloadSpec(LengthSpec.parse("120"), shared_prefix_tokens=80, shared_prefix_repeats=3), tok)
    items = [w.next_item() for _ in range(8)]
    assert [i.prefix_role for i in items] == ["first", "repeat", "repeat", "control"] * 2
    assert [i.prefix_tokens for i in items] == [80, 80, 80, 0] * 2
    heads = [tok.ids(i.prompt)[:76] for i in items]
    assert heads[0] == heads[1] == heads[2] and heads[4] == heads[5] == heads[6]
    assert heads[0][:8] != heads[4][:8]  # the next group's prefix differs from its first tokens on
    assert len({tuple(tok.ids(i.prompt)[:90]) for i in items}) == 8  # the suffixes differ
    for i in items:
        assert abs(tok.count(i.prompt) - i.input_tokens_target) <= 3
    assert abs(items[3].input_tokens_target - 40) <= 1 and abs(tok.count(items[3].prompt) - 40) <= 3
    # a sweep keeps the design
    assert w.with_input(LengthSpec.parse("200")).next_item().prefix_role is not None


def test_one_prefix_for_all_marks_the_first_use():
    w = Workload(WorkloadSpec(LengthSpec.parse("60"), shared_prefix_tokens=20))
    roles = [w.next_item().prefix_role for _ in range(4)]
    assert roles == ["first", "repeat", "repeat", "repeat"]
    assert Workload(WorkloadSpec(LengthSpec.parse("60"))).next_item().prefix_role is None
    with pytest.raises(WorkloadError, match="N:R"):
        Workload(WorkloadSpec(LengthSpec.parse("60"), shared_prefix_tokens=0, shared_prefix_repeats=2))


def _main(argv):
    from diag.cli import main

    return main(["probe", *argv])


def test_probe_records_roles_never_text(server, tmp_path, capsys):
    from diag.ground.capture import load_capture

    cap = tmp_path / "cap"
    rc = _main([server.url("ok"), "--shared-prefix", "24:2", "-n", "6", "--warmup", "0", "--input-tokens", "40",
                "--output-tokens", "2", "-o", str(cap), "--no-progress"])
    assert rc == 0
    prompts = [s.body.get("prompt") or s.body["messages"][-1]["content"] for s in server.log[-6:]]
    spans = load_capture(cap).spans
    client = spans.loc[(spans["name"] == stages.SPAN_CLIENT_REQUEST) & spans[stages.ATTR_CLIENT_PREFIX_ROLE].notna()]
    roles = client[stages.ATTR_CLIENT_PREFIX_ROLE].tolist()
    assert sorted(roles) == sorted(["first", "repeat", "control"] * 2)
    assert sorted(client[stages.ATTR_CLIENT_PREFIX_TOKENS].astype(int).tolist()) == [0, 0, 24, 24, 24, 24]
    text = (cap / "spans.otlp.jsonl").read_text()
    assert all(" ".join(p.split()[-5:]) not in text for p in prompts)  # no run of the prompts' words is in the capture


@pytest.mark.parametrize("spec", ["3:x", "0:2", "5:0", "-1"])
def test_bad_shared_prefix_is_one_line_exit_2(server, capsys, spec):
    rc = _main([server.url("ok"), "--no-capture", "--shared-prefix", spec])
    assert rc == 2
    err = capsys.readouterr().err.strip()
    assert "--shared-prefix" in err and len(err.splitlines()) == 1
