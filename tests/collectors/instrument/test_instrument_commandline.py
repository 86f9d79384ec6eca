"""The command lines and environments ``ttft instrument`` builds (engines that trace themselves are
tested as built: no GPU here)."""

from __future__ import annotations

import os

from collectors.instrument import BOOTSTRAP_DIR, commandline, runtime

RECV = "127.0.0.1:43170"


def test_vllm_serve_gets_its_otlp_switches_pointed_at_our_receiver():
    p = commandline.plan(["vllm", "serve", "meta-llama/Llama-3.1-8B", "--port", "8000"], {}, capture_dir="srv",
                         receiver_grpc=RECV)
    assert p.engine == "vllm" and p.needs_receiver
    assert p.argv == ["vllm", "serve", "meta-llama/Llama-3.1-8B", "--port", "8000",
                      "--otlp-traces-endpoint", f"grpc://{RECV}", "--collect-detailed-traces", "all"]
    assert p.env["OTEL_EXPORTER_OTLP_TRACES_INSECURE"] == "true"


def test_vllm_api_server_module_and_flags_already_given_are_kept():
    argv = ["python3", "-m", "vllm.entrypoints.openai.api_server", "--model", "m",
            "--collect-detailed-traces=model"]
    p = commandline.plan(argv, {}, capture_dir="srv", receiver_grpc=RECV)
    assert p.engine == "vllm"
    assert p.argv == argv + ["--otlp-traces-endpoint", f"grpc://{RECV}"]
    assert p.added_flags == ["--otlp-traces-endpoint", f"grpc://{RECV}"]


def test_sglang_launch_server_gets_enable_trace_and_host_port():
    p = commandline.plan(["python", "-m", "sglang.launch_server", "--model-path", "m"], {}, capture_dir="srv",
                         receiver_grpc=RECV)
    assert p.engine == "sglang"
    assert p.argv[-3:] == ["--enable-trace", "--otlp-traces-endpoint", RECV]


def test_tgi_launcher_gets_otlp_endpoint_url():
    p = commandline.plan(["text-generation-launcher", "--model-id", "m"], {}, capture_dir="srv", receiver_grpc=RECV)
    assert p.engine == "tgi"
    assert p.argv == ["text-generation-launcher", "--model-id", "m", "--otlp-endpoint", f"http://{RECV}"]


def test_a_user_otlp_url_is_passed_as_written_and_needs_no_receiver():
    p = commandline.plan(["text-generation-launcher", "--model-id", "m"], {}, otlp_url="http://collector:4317")
    assert not p.needs_receiver
    assert p.argv[-2:] == ["--otlp-endpoint", "http://collector:4317"]
    s = commandline.plan(["python", "-m", "sglang.launch_server"], {}, otlp_url="http://collector:4317")
    assert s.argv[-1] == "collector:4317"


def test_transformers_serve_gets_the_bootstrap_first_on_pythonpath_and_no_flags():
    base = {"PYTHONPATH": "/opt/site", "PATH": "/usr/bin", runtime.ENV_OTLP: "stale"}
    p = commandline.plan(["transformers", "serve", "m", "--port", "8000"], base, capture_dir="srv")
    assert p.engine == "transformers" and not p.needs_receiver and p.added_flags == []
    assert p.argv == ["transformers", "serve", "m", "--port", "8000"]
    assert p.env["PYTHONPATH"] == f"{BOOTSTRAP_DIR}{os.pathsep}/opt/site"
    assert p.env[runtime.ENV_CAPTURE] == os.path.abspath("srv")
    assert runtime.ENV_OTLP not in p.env  # a stale setting of the caller's does not leak in
    assert p.env["PATH"] == "/usr/bin"
    assert (BOOTSTRAP_DIR / "sitecustomize.py").is_file()


def test_other_commands_are_plain_python_with_the_bootstrap():
    assert commandline.detect_engine(["python", "app.py"]) == "python"
    assert commandline.detect_engine(["vllm", "bench"]) == "python"
    assert commandline.detect_engine([]) == "python"
