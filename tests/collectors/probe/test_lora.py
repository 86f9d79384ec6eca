"""``--lora A,B,...``: adapters drawn per request, sent as the model, and each request's role against
the adapters running when it was sent."""

from __future__ import annotations

import pytest

from collectors.probe.lora import LoraRoles, LoraSpecError, parse_lora
from collectors.probe.workload import LengthSpec, Workload, WorkloadSpec
from diag.ground import stages


def test_roles_follow_the_adapters_in_flight_at_each_send():
    roles = LoraRoles()
    assert roles.on_send(1, "a") == "alone"
    assert roles.on_send(2, "b") == "other"  # only "a" in flight: "b" waits for a slot when there is one
    assert roles.on_send(3, "a") == "joins"
    roles.on_done(1)
    roles.on_done(3)
    assert roles.on_send(4, "a") == "other"
    roles.on_done(2)
    roles.on_done(4)
    assert roles.on_send(5, "b") == "alone"


@pytest.mark.parametrize("text, says", [("a,,b", "separated by commas"), ("a, b c", "separated by commas"),
                                        ("a,a", "named twice")])
def test_bad_adapter_lists_get_one_line(text, says):
    with pytest.raises(LoraSpecError, match=says):
        parse_lora(text)
    assert parse_lora(" x , y ") == ("x", "y")


def test_requests_draw_adapters_from_the_list():
    w = Workload(WorkloadSpec(LengthSpec.parse("20"), lora_adapters=("x", "y", "z")))
    drawn = [w.next_item().lora for _ in range(60)]
    assert set(drawn) == {"x", "y", "z"}
    assert w.spec.describe()["lora_adapters"] == ["x", "y", "z"]
    assert Workload(WorkloadSpec(LengthSpec.parse("20"))).next_item().lora is None


def test_probe_runs_one_adapter_then_all_of_them_at_the_same_load(server, tmp_path):
    from diag.ground.capture import load_capture
    from diag.cli import main

    cap = tmp_path / "cap"
    rc = main(["probe", server.url("ok"), "--lora", "ad1,ad2", "-n", "12", "--warmup", "0", "-c", "3",
               "--input-tokens", "20", "--output-tokens", "4", "-o", str(cap), "--no-progress"])
    assert rc == 0
    sent = [s.body["model"] for s in server.log[-24:]]
    assert set(sent[:12]) == {"ad1"} and set(sent[12:]) == {"ad1", "ad2"}  # the control, then the mix
    spans = load_capture(cap).spans
    client = spans.loc[(spans["name"] == stages.SPAN_CLIENT_REQUEST) & spans[stages.ATTR_CLIENT_LORA].notna()]
    by_seg = client.groupby(stages.ATTR_SEGMENT)[stages.ATTR_CLIENT_LORA].agg(set).to_dict()
    assert by_seg == {"lora=1": {"ad1"}, "lora=2": {"ad1", "ad2"}}
    assert set(client[stages.ATTR_CLIENT_LORA_ROLE]) <= {"alone", "joins", "other"}


@pytest.mark.parametrize("argv, says", [(["--lora", "a,,b"], "--lora"), (["--sweep", "lora"], "two or more adapters"),
                                        (["--lora", "a,b", "--sweep-values", "1,3"], "at most 2 adapters")])
def test_probe_refuses_a_bad_adapter_design_with_one_line(capsys, argv, says):
    from diag.cli import main

    assert main(["probe", "http://127.0.0.1:9", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert says in err and len(err.splitlines()) == 1
