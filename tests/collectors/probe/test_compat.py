"""The first-request compatibility check: servers that refuse one optional element each."""

from __future__ import annotations

import json

import pytest

from collectors.probe import LengthSpec, LoadSpec, ProbeConfig, WorkloadSpec, run_probe
from collectors.probe.endpoint import OPTIONAL_ELEMENTS


def _cfg(url, out_dir=None, **kw):
    return ProbeConfig(url, api="chat", load=LoadSpec(concurrency=2, requests=4),
                       workload=WorkloadSpec(LengthSpec.parse("16"), LengthSpec.parse("3")), timeout_s=5,
                       output=out_dir, **kw)


@pytest.mark.parametrize("mode,element", [
    ("uuid-rid", None),  # the probe's X-Request-Id is a UUID already: nothing is refused
    ("no-tp", "traceparent"),
    ("strict", "exact_output"),
    ("no-so", "stream_options"),
])
def test_a_refused_element_is_found_dropped_and_recorded(server, tmp_path, mode, element):
    res = run_probe(_cfg(server.url(mode), tmp_path / "cap"))
    assert res.metrics["requests"]["ok"] == 4  # the run completes against that server
    meta = json.loads((tmp_path / "cap" / "meta.json").read_text())
    compat = meta["probe"]["compat"]
    measured = [s for s in server.log if not s.body.get("max_tokens") == 2]
    if element is None:
        assert compat["refused"] == [] and compat["first_error"] is None
        assert not any("compatibility" in n for n in res.notes)
        return
    assert compat["refused"] == [element] and element in compat["dropped"]
    line = next(n for n in res.notes if n.startswith("compatibility:"))
    assert OPTIONAL_ELEMENTS[element] in line and "\n" not in line
    # what the server refused is not sent again, the rest still is
    last = measured[-1]
    sent = {"traceparent": "traceparent" in last.headers, "exact_output": "min_tokens" in last.body,
            "stream_options": "stream_options" in last.body, "x_request_id": "x-request-id" in last.headers}
    assert sent.pop(element) is False and all(sent.values())


def test_several_refused_elements_are_dropped_together(server, tmp_path):
    res = run_probe(_cfg(server.url("strict-all"), tmp_path / "cap"))
    assert res.metrics["requests"]["ok"] == 4
    compat = json.loads((tmp_path / "cap" / "meta.json").read_text())["probe"]["compat"]
    assert set(compat["refused"]) == set(OPTIONAL_ELEMENTS)
    line = next(n for n in res.notes if n.startswith("compatibility:"))
    assert all(flag in line for flag in OPTIONAL_ELEMENTS.values())


def test_a_request_refused_for_itself_says_so_and_drops_nothing(server, tmp_path):
    res = run_probe(_cfg(server.url("http400"), tmp_path / "cap"))
    assert res.metrics["requests"]["ok"] == 0
    compat = json.loads((tmp_path / "cap" / "meta.json").read_text())["probe"]["compat"]
    assert compat["refused"] == [] and compat["first_status"] == 400
    line = next(n for n in res.notes if n.startswith("compatibility:"))
    assert "max_tokens too large" in line  # the server's own words
    assert "min_tokens" in server.log[-1].body  # nothing dropped for good


def test_user_dropped_elements_are_never_sent(server):
    res = run_probe(_cfg(server.url("ok"), dropped=frozenset({"x_request_id", "traceparent"})))
    assert res.metrics["requests"]["ok"] == 4
    assert not any("x-request-id" in s.headers or "traceparent" in s.headers for s in server.log)


def test_traceparent_is_tried_last(server, tmp_path):
    # a retry without traceparent would reach a traced server as an unjoined failure: the
    # check drops it only after the other elements did not help
    run_probe(_cfg(server.url("strict"), tmp_path / "cap"))
    compat_requests = [s for s in server.log if s.body.get("max_tokens") == 2]
    assert [("min_tokens" in s.body, "traceparent" in s.headers) for s in compat_requests] == [
        (True, True), (True, True), (False, True)]  # as sent; no-request-id; no-exact-output
