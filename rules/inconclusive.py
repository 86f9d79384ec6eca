"""The honest answer when the data cannot decide: ``inconclusive``, with the experiment that would.

``healthy`` means the evidence that could show a problem was there and showed none. When the
rules that could explain TTFT were skipped (their inputs are missing) and the capture's own
numbers say TTFT is far above what it should be, the verdict is :data:`rules.model.INCONCLUSIVE`
instead: evidence rows of what was seen, and next checks that start with the one experiment
that would decide. The measures of "far above" (any one suffices, thresholds in the
``[inconclusive]`` table of ``rules/defaults.toml``):

* TTFT p50 in decode steps (ITL p50): a batching engine starts a short prompt within a step or two;
* the tail: TTFT p95 many decode steps long and several times the median, on prompts like the
  others' (the slowest 5% did not send longer ones): some requests waited, whatever the median did;
* TTFT p50 against the engine's own prefill time for the prompt (its prompt seconds);
* TTFT against the service time of the requests in flight at arrival (waiting as long as a line would),
  unless the engine's own prefill time says TTFT is close to it;
* TTFT against each request's own work on this server (``rules.features.floor``), far past the
  ``[healthy]`` factors, with no rule naming the wait.

Called by the engine on its own thread, after the rules ran.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rules import evidence
from rules.model import INCONCLUSIVE, Evidence, Finding, Skipped
from rules.verdict import floor_rows

#: rules whose findings explain where TTFT goes; one of them skipped leaves TTFT unexplained
TTFT_RULES: tuple[str, ...] = ("queue", "prefill_compute", "tokenize", "network", "kv_cache")


def _experiment(feats: Any, black_box: bool) -> list[str]:
    """The deciding experiment first, then the others that would help."""
    sweep = ("run `ttft probe URL --sweep concurrency`: TTFT rising from the lowest level while per-stream "
             "decode speed holds is a queue; flat TTFT is not")
    prompt = ("run `ttft probe URL --sweep prompt`: TTFT growing with the prompt is prefill (or tokenization); "
              "a fixed part many decode steps long is outside the engine (network, proxy, front end)")
    join = "join the server's spans: `ttft analyze CLIENT SERVER` (the engine's OTLP spans split TTFT into stages)"
    scrape = "scrape /metrics during the run (`ttft probe … --metrics URL`): queue depth, running requests, prompt seconds"
    inline = feats.value("ttft_inline_ratio")
    one_prompt = not feats.available("ttft_prompt_r2")
    alone = (feats.value("inflight_at_arrival_max") or 2) <= 1
    first: list[str]
    if alone:
        # one request at a time: nothing ahead of it in our load, so no sweep of concurrency
        # decides; a prompt sweep with repeats per length does (its medians are robust to noise
        # that a workload's own spread of prompts could not beat)
        first = [prompt + " (a few requests per length: the medians stand out of noise)", sweep]
    elif inline is not None and inline >= 0.25:
        first = [sweep, prompt] if one_prompt else [sweep]
    elif one_prompt:
        first = [prompt, sweep]
    else:
        first = [sweep]
    rest = [join, scrape] if black_box else [scrape, join]
    if not black_box and feats.value("series_only"):
        rest = [join]
    return first[:1] + rest + first[1:]


def inconclusive(feats: Any, skipped: list[Skipped], th: Mapping[str, Any], slo_rows: list[Evidence],
                 black_box: bool, waits: bool = False, no_floor: bool = False) -> Finding | None:
    """An :data:`INCONCLUSIVE` finding when TTFT is far above what it should be and no rule says why:
    because TTFT rules were skipped; or (``waits``) because TTFT is far above each request's own work
    (``rules.verdict.floor_rows``); or (``no_floor``) with no own work measured to call it healthy.
    None otherwise (healthy or the SLO fallback may then apply)."""
    t = th["inconclusive"]
    skipped_ids = [s.rule_id for s in skipped if s.rule_id in TTFT_RULES]
    if not skipped_ids and not waits and not no_floor:
        return None
    rows: list[Evidence] = []
    far = waits
    if waits:
        rows.extend(floor_rows(feats, th["healthy"])[1])
    steps = feats.value("ttft_in_itl_steps_p50")
    if steps is not None:
        hit = steps >= float(t["ttft_steps_min"])
        far |= hit
        rows.append(evidence.row(evidence.TTFT_P50_STEPS, steps, float(t["ttft_steps_min"]), "steps",
                             "a batching engine starts a short prompt within a step or two", op=">=", crossed=hit))
    tail_steps, tail_prompt = feats.value("ttft_in_itl_steps_p95"), feats.value("ttft_tail_prompt_x")
    if tail_steps is not None and steps and tail_prompt is not None:
        tail_x = tail_steps / steps
        hit = (tail_steps >= float(t["ttft_steps_min"]) and tail_x >= float(t["tail_over_p50_min"])
               and tail_prompt <= float(t["tail_prompt_x_max"]))
        far |= hit
        rows.append(evidence.row(evidence.TTFT_TAIL_STEPS, tail_steps, float(t["ttft_steps_min"]), "steps",
                             f"{tail_x:.1f}x the median's (>= {float(t['tail_over_p50_min']):g}x counts) on prompts "
                             f"{tail_prompt:.2f}x the median's: the slowest waited, not for their own longer prompts",
                             op=">=", crossed=hit))
    pre = feats.value("ttft_vs_engine_prefill_ratio")
    if pre is not None:
        hit = pre >= float(t["ttft_vs_prefill_min"])
        far |= hit
        rows.append(evidence.row(evidence.TTFT_OVER_PREFILL, pre, float(t["ttft_vs_prefill_min"]), "x",
                             "what the engine itself spends on the prompt (its prompt seconds)", op=">=", crossed=hit))
    inline = feats.value("ttft_inline_ratio")
    if inline is not None:
        # the engine measured TTFT close to its own prefill time: the line the client's proxy suggests
        # (short answers make a normal prefill a large part of the service time ahead) is not there
        hit = (inline >= float(t["inline_ratio_min"]) and (steps is None or steps >= float(t["inline_steps_min"]))
               and (pre is None or pre >= float(t["ttft_vs_prefill_min"])))
        far |= hit
        rows.append(evidence.row(evidence.INLINE_RATIO, inline, float(t["inline_ratio_min"]),
                             "x", "as long as waiting for the requests in flight to finish would take", op=">=",
                             crossed=hit))
    if not far:
        return None
    p50 = feats.value("ttft_p50_s")
    rows.insert(0, evidence.row(evidence.TTFT_P50, p50, None, "s", "over the steady requests"))
    if skipped_ids:
        rows.append(evidence.row(evidence.RULES_NOT_RUN, float(len(skipped_ids)), None, "count",
                             ", ".join(skipped_ids) + " (see skipped rules: what each needs)"))
    rows.extend(slo_rows)
    return Finding("inconclusive", INCONCLUSIVE,
                   "Inconclusive: TTFT is far above what this capture says it should be, and the evidence that "
                   "would say why is missing", float(t["confidence"]), None, None, rows, _experiment(feats, black_box),
                   note="not healthy and not a bottleneck: the data cannot decide; the first check is the "
                   "experiment that would", tier=3)
