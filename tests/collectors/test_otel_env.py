"""OpenTelemetry's environment conventions: OTEL_EXPORTER_OTLP_[TRACES_]ENDPOINT name where spans
go without --otlp, OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES set the resource (ours only
by default), gen_ai.provider.name goes beside the deprecated gen_ai.system; checked end to end
with a real ttft serve and ttft probe exporting into a real OTLP receiver."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from collectors.otel_env import check_protocol, endpoint_from_env, resource_for, traces_url
from collectors.otlp_receiver import OTLPReceiver

ROOT = Path(__file__).resolve().parents[2]


def test_endpoints_follow_the_spec() -> None:
    assert traces_url("http://h:4318") == "http://h:4318/v1/traces"
    assert traces_url("http://h:4318/") == "http://h:4318/v1/traces"
    assert traces_url("http://h:4318/custom/traces") == "http://h:4318/custom/traces"  # a path is used as given
    assert endpoint_from_env({}) is None
    assert endpoint_from_env({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318/"}) == "http://c:4318/v1/traces"
    both = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://t:9/x"}
    assert endpoint_from_env(both) == "http://t:9/x"
    check_protocol({"OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf"})
    with pytest.raises(ValueError, match="only http/protobuf"):
        check_protocol({"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"})
    # the traces-specific setting wins over the general one
    check_protocol({"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"})


def test_the_environment_names_the_service_ours_is_the_default() -> None:
    assert resource_for("ttft-probe", {}).attributes["service.name"] == "ttft-probe"
    r = resource_for("ttft-probe", {"OTEL_SERVICE_NAME": "checkout-probe",
                                    "OTEL_RESOURCE_ATTRIBUTES": "deployment.environment=ci,team=a%2Cb"})
    assert r.attributes["service.name"] == "checkout-probe"
    assert r.attributes["deployment.environment"] == "ci" and r.attributes["team"] == "a,b"
    named = resource_for("ttft-engine", {"OTEL_RESOURCE_ATTRIBUTES": "service.name=llm-eu"})
    assert named.attributes["service.name"] == "llm-eu"


class _Spans:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.items: list[tuple[dict[str, str], str, dict[str, str]]] = []

    def __call__(self, msg) -> None:  # type: ignore[no-untyped-def]
        with self.lock:
            for rs in msg.resource_spans:
                res = {kv.key: kv.value.string_value for kv in rs.resource.attributes}
                for ss in rs.scope_spans:
                    for s in ss.spans:
                        self.items.append((res, s.name, {kv.key: kv.value.string_value for kv in s.attributes}))

    def roots(self, service: str) -> list[dict[str, str]]:
        with self.lock:
            return [a for res, _, a in self.items if res.get("service.name") == service and "gen_ai.provider.name" in a]


@pytest.mark.slow
def test_serve_and_probe_export_where_the_environment_says(tmp_path: Path) -> None:
    spans = _Spans()
    with OTLPReceiver(spans, port=0) as receiver:
        env = dict(os.environ, PYTHONPATH=str(ROOT), OTEL_EXPORTER_OTLP_ENDPOINT=f"http://127.0.0.1:{receiver.address[1]}",
                   OTEL_RESOURCE_ATTRIBUTES="deployment.environment=ci")
        env.pop("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", None)
        serve = subprocess.Popen([sys.executable, "-m", "diag", "serve", "--port", "0"], cwd=ROOT,
                                 env={**env, "OTEL_SERVICE_NAME": "llm-under-test"}, stdout=subprocess.PIPE,
                                 stderr=subprocess.DEVNULL, text=True)
        try:
            assert serve.stdout is not None
            line = serve.stdout.readline()
            url = line.split("listening on ")[1].split()[0]
            probe = subprocess.run([sys.executable, "-m", "diag", "probe", url, "-c", "2", "-n", "6", "--output-tokens",
                                    "4", "-o", str(tmp_path / "cli")], cwd=ROOT, env={**env, "OTEL_SERVICE_NAME": "my-probe"},
                                   capture_output=True, text=True, timeout=180)
            assert probe.returncode == 0, probe.stderr
            deadline = time.time() + 20
            while time.time() < deadline and (len(spans.roots("my-probe")) < 6 or len(spans.roots("llm-under-test")) < 6):
                time.sleep(0.2)
        finally:
            serve.terminate()
            serve.wait(30)
    client, server = spans.roots("my-probe"), spans.roots("llm-under-test")
    assert len(client) >= 6 and len(server) >= 6
    assert {a["gen_ai.provider.name"] for a in client} == {"openai"} == {a["gen_ai.system"] for a in client}
    assert {a["gen_ai.provider.name"] for a in server} == {"ttft-diag"}
    assert all(res.get("deployment.environment") == "ci" for res, _, _ in spans.items)
    assert (tmp_path / "cli" / "spans.otlp.jsonl").exists()  # the capture is written as well
