"""llama.cpp server: its hand-written exposition (counters, then gauges, C++ ostream formatting)."""

from __future__ import annotations

from samplegen.common import Events, state_at
from samplegen.sim import Req, SimResult, Step

def _cpp_double(v: float) -> str:
    """A double through C++ ``ostream <<`` with default flags: ``%g``, 6 significant digits."""
    return format(float(v), ".6g")


LLAMACPP_COUNTERS = (
    ("prompt_tokens_total", "Prompt tokens processed."),
    ("prompt_seconds_total", "Time spent processing prompts (s)."),
    ("tokens_predicted_total", "Tokens generated."),
    ("tokens_predicted_seconds_total", "Time spent generating (s)."),
    ("n_decode_total", "llama_decode() calls."),
    ("n_tokens_max", "Largest n_tokens seen."),
    ("n_busy_slots_per_decode", "Mean busy slots per llama_decode() call."),
)
LLAMACPP_GAUGES = (
    ("prompt_tokens_seconds", "Recent prompt throughput (tokens/s)."),
    ("predicted_tokens_seconds", "Recent generation throughput (tokens/s)."),
    ("requests_processing", "Requests being processed."),
    ("requests_deferred", "Requests deferred."),
)


def llamacpp_texts(sim: SimResult) -> list[str]:
    """The llama.cpp server's hand-written exposition (tools/server): counters, then gauges."""
    acc = {"prompt_tokens": 0, "prompt_ms": 0.0, "pred_tokens": 0, "pred_ms": 0.0, "n_decode": 0, "busy": 0,
           "n_tokens_max": 0}
    bucket = {"prompt_tokens": 0, "prompt_ms": 0.0, "pred_tokens": 0, "pred_ms": 0.0}
    ev = Events()
    for r in sim.reqs:
        def prompt_done(r: Req = r) -> None:  # on_prompt_eval: after the slot's prompt is processed
            ms = (r.first_token - r.scheduled) * 1e3
            for d in (acc, bucket):
                d["prompt_tokens"] += r.prompt
                d["prompt_ms"] += ms
            acc["n_tokens_max"] = max(acc["n_tokens_max"], r.prompt)

        def released(r: Req = r) -> None:  # on_prediction: when the slot is released
            ms = (r.finish - r.first_token) * 1e3
            for d in (acc, bucket):
                d["pred_tokens"] += r.output
                d["pred_ms"] += ms
            acc["n_tokens_max"] = max(acc["n_tokens_max"], r.prompt + r.output)

        ev.add(r.first_token, prompt_done)
        ev.add(r.finish, released)
    for s in sim.steps:
        def decode_call(s: Step = s) -> None:
            acc["n_decode"] += 1
            acc["busy"] += s.running + (1 if s.first_tokens else 0)

        ev.add(s.end, decode_call)
    texts = []
    for t in sim.scrape_times:
        ev.until(t)
        st = state_at(sim, t)
        values = {
            "prompt_tokens_total": acc["prompt_tokens"],
            "prompt_seconds_total": acc["prompt_ms"] / 1e3,
            "tokens_predicted_total": acc["pred_tokens"],
            "tokens_predicted_seconds_total": acc["pred_ms"] / 1e3,
            "n_decode_total": acc["n_decode"],
            "n_tokens_max": acc["n_tokens_max"],
            "n_busy_slots_per_decode": acc["busy"] / max(acc["n_decode"], 1),
            "prompt_tokens_seconds": 1e3 / bucket["prompt_ms"] * bucket["prompt_tokens"] if bucket["prompt_ms"] else 0.0,
            "predicted_tokens_seconds": 1e3 / bucket["pred_ms"] * bucket["pred_tokens"] if bucket["pred_ms"] else 0.0,
            "requests_processing": st.running,
            "requests_deferred": st.waiting,
        }
        out = []
        for typ, table in (("counter", LLAMACPP_COUNTERS), ("gauge", LLAMACPP_GAUGES)):
            for name, help_ in table:
                out += [f"# HELP llamacpp:{name} {help_}", f"# TYPE llamacpp:{name} {typ}",
                        f"llamacpp:{name} {_cpp_double(values[name])}"]
        texts.append("\n".join(out) + "\n")
        for k in bucket:  # the server resets its recent bucket on every /metrics call
            bucket[k] = 0 if isinstance(bucket[k], int) else 0.0
    return texts
