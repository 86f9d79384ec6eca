"""Post-import hooks and guarded wrappers: a hook never breaks the code it wraps."""

from __future__ import annotations

import os
import signal
import sys
import textwrap
import time

import pytest

from collectors.instrument import tx_request as rq
from collectors.instrument.hooks import HookStats, HookSwitch, PostImportHooks, wrap_method
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


def test_a_switched_off_wrapper_calls_only_the_original_and_on_again_runs_the_hook():
    stats, switch, calls = HookStats(), HookSwitch(), []

    class Engine:
        def step(self, x):
            return x * 2

    def make(orig):
        def step(self, x):
            calls.append(x)
            return orig(self, x) + 1
        return step

    assert wrap_method(Engine, "step", make, stats, "step", switch)
    assert Engine().step(3) == 7 and calls == [3]
    switch.set(False)
    assert Engine().step(4) == 8 and calls == [3]  # the original's result, no hook
    switch.set(True)
    assert Engine().step(5) == 11 and calls == [3, 5]
    assert [on for _t, on in switch.toggles] == [False, True]


def test_the_toggle_signal_pauses_and_resumes_the_hooks_and_meta_lists_the_flips():
    inst = Instrumentation(environ={"TTFT_INSTRUMENT_TOGGLE_SIGNAL": "usr2", "TTFT_INSTRUMENT_PAUSED": "1"})
    assert not inst.switch.on  # started paused
    previous = signal.getsignal(signal.SIGUSR2)
    try:
        inst.install_toggle()
        os.kill(os.getpid(), signal.SIGUSR2)
        deadline = time.monotonic() + 5
        while not inst.switch.on and time.monotonic() < deadline:
            time.sleep(0.01)
        assert inst.switch.on
        meta = inst.meta_block()
        assert meta["toggle_signal"] == "usr2" and meta["tracing_on"] is True
        assert [t["on"] for t in meta["toggles"]] == [True]
    finally:
        signal.signal(signal.SIGUSR2, previous)


def test_paused_without_a_toggle_signal_or_with_an_unknown_one_traces():
    assert Instrumentation(environ={"TTFT_INSTRUMENT_PAUSED": "1"}).switch.on  # nothing could resume it
    inst = Instrumentation(environ={"TTFT_INSTRUMENT_TOGGLE_SIGNAL": "NOPE", "TTFT_INSTRUMENT_PAUSED": "1"})
    inst.install_toggle()
    assert inst.switch.on and "toggle_signal" not in inst.meta_block()
