"""Each engine's next-check lines (``NEXT_CHECKS`` of the modules of diag.ground.external) and
:func:`diag.ground.external.next_checks`, the one way the rules read them."""

from __future__ import annotations

import pkgutil
from importlib import import_module

import diag.ground.external
from diag.ground.external import ENGINES, next_checks

#: how each engine's lines name it first, so that a line in the wrong module shows
LABELS = {"vllm": ("vLLM:",), "sglang": ("SGLang:",), "llamacpp": ("llama.cpp:",), "trtllm": ("TensorRT-LLM:",),
          "dynamo": ("Dynamo:",), "bundled": ("the bundled engine:", "the bundled server:")}


def test_every_engine_module_is_listed_and_holds_next_checks() -> None:
    modules = {m.name for m in pkgutil.iter_modules(diag.ground.external.__path__)}
    assert set(ENGINES) == modules and len(ENGINES) == len(set(ENGINES))
    for name in ENGINES:
        assert isinstance(import_module(f"diag.ground.external.{name}").NEXT_CHECKS, dict), name


def test_next_check_keys_are_rule_ids_and_lines_name_their_engine() -> None:
    import rules.runner  # noqa: F401  (registers every rule)
    from rules.base import REGISTRY

    for name in ENGINES:
        lines = import_module(f"diag.ground.external.{name}").NEXT_CHECKS
        assert set(lines) <= set(REGISTRY), (name, sorted(set(lines) - set(REGISTRY)))
        for rule_id, line in lines.items():
            assert line.startswith(LABELS[name]), (name, rule_id, line)


def test_next_checks_gathers_one_rules_lines_in_engine_order() -> None:
    from diag.ground.external import bundled, llamacpp, trtllm, vllm

    assert next_checks("kv_reservation") == {"trtllm": trtllm.NEXT_CHECKS["kv_reservation"],
                                             "bundled": bundled.NEXT_CHECKS["kv_reservation"]}
    assert list(next_checks("frontend")) == ["vllm", "sglang", "llamacpp", "dynamo", "bundled"]
    assert list(next_checks("prefix_cache")) == ["vllm", "sglang", "llamacpp", "trtllm", "bundled"]
    assert next_checks("prefix_cache")["llamacpp"] is llamacpp.NEXT_CHECKS["prefix_cache"]
    assert next_checks("head_of_line")["vllm"] is vllm.NEXT_CHECKS["head_of_line"]
    assert next_checks("no_such_rule") == {}
