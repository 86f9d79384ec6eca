"""Post-import hooks and guarded wrappers: a hook never breaks the code it wraps."""

from __future__ import annotations

import sys
import textwrap

import pytest

from collectors.instrument import tx_request as rq
from collectors.instrument.hooks import HookStats, PostImportHooks, wrap_method
from collectors.instrument.runtime import Instrumentation
from collectors.instrument.transformers_serve import _Patches


@pytest.fixture
def fake_module(tmp_path, monkeypatch):
    (tmp_path / "ttft_fake_engine.py").write_text(textwrap.dedent("""
        def tokenize(text):
            return [len(w) for w in text.split()]
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("ttft_fake_engine", None)
    yield "ttft_fake_engine"
    sys.modules.pop("ttft_fake_engine", None)


def test_a_module_is_patched_when_imported_and_from_imports_see_the_patch(fake_module):
    stats = HookStats()
    hooks = PostImportHooks(stats)
    calls = []

    def patcher(mod):
        wrap_method(mod, "tokenize", lambda orig: lambda text: calls.append(text) or orig(text), stats, "tokenize")

    hooks.register(fake_module, patcher)
    hooks.install()
    try:
        from ttft_fake_engine import tokenize  # noqa: PLC0415 - the import under test

        assert tokenize("a bb ccc") == [1, 2, 3] and calls == ["a bb ccc"]
        assert stats.patched == ["tokenize"] and stats.total_errors == 0
    finally:
        sys.meta_path.remove(hooks)


def test_a_patcher_that_raises_is_counted_and_the_module_still_imports(fake_module):
    stats = HookStats()
    hooks = PostImportHooks(stats)
    hooks.register(fake_module, lambda mod: 1 / 0)
    hooks.install()
    try:
        import ttft_fake_engine  # noqa: PLC0415

        assert ttft_fake_engine.tokenize("x y") == [1, 1]
        assert stats.errors == {f"patch:{fake_module}": 1}
    finally:
        sys.meta_path.remove(hooks)


class _RaisingTrace:
    def record_stage(self, *a, **kw):
        raise RuntimeError("exporter on fire")


class _Tokenizer:
    def apply_chat_template(self, messages, add_generation_prompt=True):
        return {"input_ids": [1, 2, 3, len(messages)]}


def test_a_hook_that_raises_is_swallowed_counted_and_the_engine_gets_its_result():
    inst = Instrumentation(environ={})
    p = _Patches(inst, "5.24.0")
    p.wrap(_Tokenizer, "apply_chat_template", p._make_tokenize)
    req = rq.ServeRequest(None, "/v1/chat/completions")
    req.trace = _RaisingTrace()
    token = rq.CURRENT.set(req)
    try:
        out = _Tokenizer().apply_chat_template([{"role": "user", "content": "hi"}])
        again = _Tokenizer().apply_chat_template([{"role": "user", "content": "hi"}])
    finally:
        rq.CURRENT.reset(token)
    assert out == again == {"input_ids": [1, 2, 3, 1]}
    assert inst.stats.errors == {"tokenize": 1}
    meta = inst.meta_block()
    assert meta["hook_errors_total"] == 1 and "exporter on fire" in meta["hook_first_error"]["tokenize"]


def test_wrapping_twice_is_a_no_op():
    stats = HookStats()

    class Engine:
        def step(self):
            return 7

    make = lambda orig: lambda self: orig(self) + 1  # noqa: E731
    assert wrap_method(Engine, "step", make, stats, "step")
    assert not wrap_method(Engine, "step", make, stats, "step")
    assert Engine().step() == 8
