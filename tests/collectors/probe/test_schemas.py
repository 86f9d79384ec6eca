"""``--response-format``: the schema designs, their keys and roles, and what the client sends and records."""

from __future__ import annotations

import json
import random

import pytest

from collectors.probe.schemas import (SchemaDraws, SchemaRoles, SchemaSpecError, generated_schema,
                                      parse_response_format, schema_key)
from collectors.probe.workload import LengthSpec, Workload, WorkloadSpec
from diag.ground import stages


def _keys(spec: str, n: int, **kw) -> list[str]:
    draws = SchemaDraws(parse_response_format(spec, **kw), seed=7)
    return [draws.next()[1] for _ in range(n)]


def test_designs_send_fresh_grouped_or_one_schema():
    fresh = _keys("schema:fresh", 4)
    assert len(set(fresh)) == 4
    grouped = _keys("schema:3", 6)
    assert grouped[0] == grouped[1] == grouped[2] != grouped[3] == grouped[4] == grouped[5]
    assert _keys("schema", 8)[:4] == [_keys("schema", 8)[0]] * 4  # default groups of 4
    assert len(set(_keys("schema:repeat", 5))) == 1
    fmt, key = SchemaDraws(parse_response_format("json"), seed=1).next()
    assert fmt == {"type": "json_object"} and key == "json_object"


def test_generated_schemas_share_no_names_and_grow_with_properties():
    rng = random.Random(3)
    a, b = generated_schema(8, rng), generated_schema(8, rng)
    assert len(a["properties"]) == 8 and a["required"] == list(a["properties"])
    assert not set(a["properties"]) & set(b["properties"])
    assert len(json.dumps(generated_schema(80, rng))) > 8 * len(json.dumps(a))
    # the key is the canonical JSON's: key order does not change it, content does
    assert schema_key(dict(reversed(list(a.items())))) == schema_key(a) != schema_key(b)


def test_a_users_schema_file_is_sent_as_is_or_retitled_when_fresh(tmp_path):
    path = tmp_path / "tools.json"
    user = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    path.write_text(json.dumps(user))
    fmt, key = SchemaDraws(parse_response_format("schema:repeat", schema_file=str(path)), seed=1).next()
    assert fmt["json_schema"]["schema"] == user and key == schema_key(user)
    draws = SchemaDraws(parse_response_format("schema:fresh", schema_file=str(path)), seed=1)
    sent = [draws.next()[0]["json_schema"]["schema"] for _ in range(3)]
    assert len({s["title"] for s in sent}) == 3 and all(s["properties"] == user["properties"] for s in sent)


@pytest.mark.parametrize("spec, kw, message", [
    ("xml", {}, "expected json, schema"),
    ("schema:0", {}, "group size must be >= 1"),
    ("schema:often", {}, "fresh, repeat or a group size"),
    ("schema", {"properties": 0}, "--schema-properties"),
    ("json", {"schema_file": "x.json"}, "--schema goes with"),
])
def test_bad_specs_get_one_line(spec, kw, message):
    with pytest.raises(SchemaSpecError, match=message) as err:
        parse_response_format(spec, **kw)
    assert "\n" not in str(err.value)


def test_a_schema_file_that_is_not_a_schema_is_refused(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("[1, 2]")
    with pytest.raises(SchemaSpecError, match="expected a JSON schema object"):
        parse_response_format("schema", schema_file=str(bad))
    with pytest.raises(SchemaSpecError, match="No such file"):
        parse_response_format("schema", schema_file=str(tmp_path / "missing.json"))


def test_roles_follow_first_tokens_not_sends():
    roles = SchemaRoles()
    assert roles.on_send("a") == "first"
    assert roles.on_send("a") == "concurrent"  # the first use has no token yet: it may wait on the same compile
    roles.on_first_token("a")
    assert roles.on_send("a") == "repeat"
    assert roles.on_send("b") == "first"


def test_workload_items_carry_the_format_and_keep_it_across_sweeps():
    w = Workload(WorkloadSpec(LengthSpec.parse("30"), response_format=parse_response_format("schema:2")))
    items = [w.next_item() for _ in range(4)]
    assert all(i.response_format["type"] == "json_schema" for i in items)
    assert items[0].schema_key == items[1].schema_key != items[2].schema_key
    assert w.with_input(LengthSpec.parse("60")).next_item().schema_key is not None
    assert w.spec.describe()["response_format"].startswith("schema:2")
    assert Workload(WorkloadSpec(LengthSpec.parse("30"))).next_item().response_format is None


def test_probe_sends_the_schema_and_records_only_its_key_and_role(server, tmp_path):
    from diag.ground.capture import load_capture
    from diag.cli import main

    cap = tmp_path / "cap"
    rc = main(["probe", server.url("ok"), "--response-format", "schema:3", "--schema-properties", "5", "-n", "6",
               "--warmup", "0", "-c", "1", "--input-tokens", "20", "--output-tokens", "2", "-o", str(cap),
               "--no-progress"])
    assert rc == 0
    sent = [s.body["response_format"] for s in server.log[-6:]]
    assert all(f["type"] == "json_schema" and len(f["json_schema"]["schema"]["properties"]) == 5 for f in sent)
    spans = load_capture(cap).spans
    client = spans.loc[(spans["name"] == stages.SPAN_CLIENT_REQUEST) & spans[stages.ATTR_CLIENT_SCHEMA_ROLE].notna()]
    assert sorted(client[stages.ATTR_CLIENT_SCHEMA_ROLE]) == sorted(["first", "repeat", "repeat"] * 2)
    assert client[stages.ATTR_CLIENT_SCHEMA_KEY].nunique() == 2
    names = list(sent[0]["json_schema"]["schema"]["properties"])
    assert names[0] not in (cap / "spans.otlp.jsonl").read_text()  # the schema itself is never recorded


def test_probe_refuses_a_bad_spec_with_one_line(capsys):
    from diag.cli import main

    assert main(["probe", "http://127.0.0.1:9", "--response-format", "schema:nope"]) == 2
    err = capsys.readouterr().err.strip()
    assert "--response-format" in err and len(err.splitlines()) == 1
