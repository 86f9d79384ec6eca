import pytest

from diag.ground.otlp_json import OTLPJSONError, dict_to_request, json_to_request, request_to_dict


@pytest.mark.parametrize("doc", [{"resourceSpans": "nope"}, {"resourceSpans": [1, {"scopeSpans": 3}]},
                                 {"resourceSpans": [{"scopeSpans": [{"spans": [{"traceId": "zz"}]}]}]}, [1]])
def test_wrong_shapes_raise_only_otlp_json_error(doc):
    with pytest.raises(OTLPJSONError):
        dict_to_request(doc)


def test_hex_ids_round_trip():
    doc = {"resourceSpans": [{"scopeSpans": [{"spans": [{"traceId": "0af7651916cd43dd8448eb211c80319c",
                                                         "spanId": "b7ad6b7169203331", "name": "x", "kind": 2,
                                                         "startTimeUnixNano": "1", "endTimeUnixNano": "2"}]}]}]}
    msg = dict_to_request(doc)
    assert msg.resource_spans[0].scope_spans[0].spans[0].trace_id.hex() == "0af7651916cd43dd8448eb211c80319c"
    back = request_to_dict(msg)
    span = back["resourceSpans"][0]["scopeSpans"][0]["spans"][0]
    assert span["traceId"] == "0af7651916cd43dd8448eb211c80319c" and span["kind"] == 2
    assert span["startTimeUnixNano"] == "1"
    with pytest.raises(OTLPJSONError):
        json_to_request(b"{not json")
