"""The catalogue of evidence rows: each row's stable key and the name it is shown by.

A key (``"decode_hold"``) is what code matches: the override table, the rules that read another
row, the tests. A name (``"per-stream decode speed, highest / lowest concurrency"``) is what the
text, the reports, the JSON and the TUI show; rewording it changes no key. A rule passes a key
to :class:`rules.base.Triage` (or builds a row with :func:`row`), which takes the name from here.

Rows of one kind for several members (a stage's share of TTFT, an SLO target) are a family: the
key is ``family.member`` (``"share_tail.queue"``, ``"slo.ttft_p99"``) and the name the family's
template filled with the member (:data:`FAMILIES`). Data and lookups only, any thread.
"""

from __future__ import annotations

from typing import Any

from rules.model import Evidence

#: key -> name of every row declared below
NAMES: dict[str, str] = {}
#: family -> the name's template (``str.format`` of the member)
FAMILIES: dict[str, str] = {
    "share_tail": "{} share of TTFT (slowest 5%)",
    "share_metrics": "{} share of TTFT (engine metrics)",
    "share_median": "{} share of TTFT (median requests)",
    "slo": "SLO {}",
    "slo_mixed": "SLO {} with long prompts among the streams",
}


def _row(key: str, name: str) -> str:
    """Declare a row: ``key`` shown as ``name``; each key and each name once."""
    if key in NAMES or name in NAMES.values():
        raise ValueError(f"evidence row declared twice: {key!r} ({name!r})")
    NAMES[key] = name
    return key


def family(family_: str, member: str) -> str:
    """The key of ``member``'s row of ``family_`` (:data:`FAMILIES`)."""
    if family_ not in FAMILIES:
        raise KeyError(f"no evidence row family {family_!r}")
    return family_ + "." + member


def stage_share_tail(stage: str) -> str:
    """The key of "<stage> share of TTFT (slowest 5%)"."""
    return family("share_tail", stage)


def stage_share_metrics(stage: str) -> str:
    """The key of "<stage> share of TTFT (engine metrics)": the engine's histograms' means."""
    return family("share_metrics", stage)


def stage_share_median(stage: str) -> str:
    """The key of "<stage> share of TTFT (median requests)"."""
    return family("share_median", stage)


def slo(target: str) -> str:
    """The key of an SLO row (``target``: ``"ttft_p99"``-style, :mod:`diag.ground.slo`)."""
    return family("slo", target)


def slo_mixed(target: str) -> str:
    """The key of an SLO row over ttft diagnose's mixed follow-up (long prompts among the streams)."""
    return family("slo_mixed", target)


def name_of(key: str) -> str:
    """The name a row of ``key`` is shown by; KeyError for a key not declared here."""
    if key in NAMES:
        return NAMES[key]
    fam, dot, member = key.partition(".")
    if dot and fam in FAMILIES:
        return FAMILIES[fam].format(member)
    raise KeyError(f"no evidence row {key!r} (rules.evidence)")


def row(key: str, value: Any, threshold: Any, unit: str, meaning: str, op: str | None = None,
        crossed: bool | None = None) -> Evidence:
    """An evidence row of ``key``, named from the catalogue (fields as :class:`rules.model.Evidence`)."""
    return Evidence(name_of(key), value, threshold, unit, meaning, op=op, crossed=crossed, key=key)

# --- rules.runner --------------------------------------------------------------------------------

REQUESTS_N = _row("requests_n", "requests")
FAILED_N = _row("failed_n", "failed")
TTFT_P95 = _row("ttft_p95", "TTFT p95")

# --- rules.verdict -------------------------------------------------------------------------------

FLOOR_RATIO_P50 = _row("floor_ratio_p50", "TTFT / own work (median request)")
FLOOR_RATIO_P90 = _row("floor_ratio_p90", "TTFT / own work (90th percentile)")
FLOOR_P50 = _row("floor_p50", "own work (median)")
LEADING_CONFIDENCE = _row("leading_confidence", "leading candidate's confidence")

# --- rules.inconclusive --------------------------------------------------------------------------

TTFT_P50 = _row("ttft_p50", "TTFT p50")
TTFT_P50_STEPS = _row("ttft_p50_steps", "TTFT p50 / ITL p50")
TTFT_TAIL_STEPS = _row("ttft_tail_steps", "TTFT p95 / ITL p50 (the tail)")
TTFT_OVER_PREFILL = _row("ttft_over_prefill", "TTFT p50 / the engine's prefill time")
INLINE_RATIO = _row("inline_ratio", "TTFT / (requests ahead x their service time)")
RULES_NOT_RUN = _row("rules_not_run", "rules that could explain TTFT but could not run")

# --- rules.queueing, rules.tokenization, rules.long_ramp, rules.kv_cache -------------------------

QUEUE_SHARE_METRICS = stage_share_metrics("queue")
TTFT_RISE_X = _row("ttft_rise_x", "TTFT at highest / lowest concurrency")
TTFT_RISE_STEPS = _row("ttft_rise_steps", "TTFT rise / ITL at the highest concurrency")
AFTER_END_SHARE = _row("after_end_share", "first token just after another stream ended")
INFLIGHT_AT_ARRIVAL_P50 = _row("inflight_at_arrival_p50", "requests in flight at arrival (median)")
SHORT_RAMP_CAP = _row("short_ramp_cap", "streams decoding at once, short prompts (most)")
STALLED_STREAMS = _row("stalled_streams", "streams stalled mid-answer while others streamed")
STALL_GAP_P50 = _row("stall_gap_p50", "their longest gap (median)")
TTFT_P95_STEPS = _row("ttft_p95_steps", "TTFT p95 / ITL p50")
KNEE_TTFT_X = _row("knee_ttft_x", "TTFT past the knee / at the knee")
QUEUE_TIME_METRICS_MEAN = _row("queue_time_metrics_mean", "queue time (engine metric, mean)")
WAITING_FOR_CAPACITY = _row("waiting_for_capacity", "waiting requests held for scheduling capacity (engine gauge)")
QUEUE_WAIT_STEPS = _row("queue_wait_steps", "queue wait / step in flight")
NEXT_AFTER_END_SHARE = _row("next_after_end_share", "first token next after a stream end (order of events)")
WAITED_STREAMED_ALONE = _row("waited_streamed_alone", "waiting requests that streamed alone")
AT_CAP_SCRAPES = _row("at_cap_scrapes", "scrapes with requests waiting while running is at its cap")
TOKENIZE_SHARE_METRICS = stage_share_metrics("tokenize")
TOKENIZE_SHARE_TAIL = stage_share_tail("tokenize")
LONG_OUT_CAP = _row("long_out_cap", "streams decoding at once, long prompts with longer answers")
KV_USAGE_P95 = _row("kv_usage_p95", "KV usage p95")
KV_NEAR_FULL_SHARE = _row("kv_near_full_share", "time with KV usage near capacity")
PREEMPTIONS = _row("preemptions", "preemptions")
KV_WAIT_AFTER_STEPS = _row("kv_wait_after_steps", "steps after which a request waited for KV blocks")
DEVICE_BUSY_QUEUED = _row("device_busy_queued", "device busy while requests queued")
TOKENIZER_CPU_SHARE = _row("tokenizer_cpu_share", "tokenizer share of CPU samples")
TTFT_SLOPE = _row("ttft_slope", "TTFT slope")
WAITING_P95 = _row("waiting_p95", "requests waiting (p95)")
LONG_RAMP_SHIFT = _row("long_ramp_shift", "shift with the tokens each request holds")
LONG_RAMP_CAP = _row("long_ramp_cap", "streams decoding at once, long prompts (most)")

# --- rules.admission -----------------------------------------------------------------------------

HOL_TTFT_X_NO_QUEUE = _row("hol_ttft_x_no_queue", "short TTFT behind a long prompt / without its queue wait")
HOL_TTFT_X = _row("hol_ttft_x", "short TTFT behind a long prompt / without")
HOL_LOST_FRAC = _row("hol_lost_frac", "short requests behind a long prompt that lost their TTFT")
HOL_PROMPT_X = _row("hol_prompt_x", "long / short prompt tokens")
HOL_OTHERS_STEPS = _row("hol_others_steps", "engine steps the other streams took while they waited")
HOL_QUEUE_SHARE = _row("hol_queue_share", "queue share of the TTFT those short requests lost")
QUEUE_SHARE_TAIL = stage_share_tail("queue")
STEPS_WITH_WAITING = _row("steps_with_waiting", "engine steps with a request waiting")
KV_USAGE_WAITING_P95 = _row("kv_usage_waiting_p95", "KV usage while requests waited (p95)")
PREFILL_BOUND_STEPS = _row("prefill_bound_steps", "steps whose prefill hit its per-step limit while requests waited")
HOL_QUEUED_STEPS = _row("hol_queued_steps", "engine steps while they queued")
HOL_KV_USAGE_MAX = _row("hol_kv_usage_max", "KV usage while they queued (max)")
HOL_RUNNING_MAX = _row("hol_running_max", "running sequences while they queued (max)")
PREFILL_STEPS_WAITING = _row("prefill_steps_waiting", "steps with prefill work while requests waited")
RUNNING_OVER_CAP = _row("running_over_cap", "running sequences while waiting / running cap")
RUNNING_OVER_MOST = _row("running_over_most", "running sequences while waiting / the most that ran")
RUNNING_WAITING_P50 = _row("running_waiting_p50", "running sequences while waiting (median)")

# --- rules.compute -------------------------------------------------------------------------------

PROMPT_FIT_R2 = _row("prompt_fit_r2", "TTFT vs prompt tokens R²")
PROMPT_SLOPE_T = _row("prompt_slope_t", "TTFT slope / its standard error")
PROMPT_PART_P50 = _row("prompt_part_p50", "prompt-proportional part of median TTFT")
COMM_SHARE_PREFILL = _row("comm_share_prefill", "comm share of prefill")
TP_SLOPE_X = _row("tp_slope_x", "TTFT per prompt token, highest / lowest TP")
PROMPT_TOKENS_PER_BUSY_S = _row("prompt_tokens_per_busy_s", "prompt tokens per prompt-processing second")
PROMPT_TOKENS_PER_S = _row("prompt_tokens_per_s", "prompt tokens computed per second")
PROMPT_WORK_P50 = _row("prompt_work_p50", "prompt work of the median request")
DEVICE_BUSY = _row("device_busy", "device busy fraction")
SLOPE_PER_ITL = _row("slope_per_itl", "TTFT per prompt token / ITL p50")
PREFILL_SHARE_METRICS = stage_share_metrics("prefill")
FIT_ALONE_SHARE = _row("fit_alone_share", "fitted requests alone in flight")
PREFILL_BUSY_RATIO = _row("prefill_busy_ratio", "prefill busy: prompt-processing seconds per second")
WAITING_MAX = _row("waiting_max", "requests waiting (max)")

# --- rules.edges ---------------------------------------------------------------------------------

COLD_WAITED = _row("cold_waited", "requests that arrived during start-up and waited")
INTERCEPT_STEPS = _row("intercept_steps", "fixed part of TTFT / ITL p50")
INTERCEPT_SHARE = _row("intercept_share", "fixed part of TTFT / TTFT p50")
INTERCEPT_LOW = _row("intercept_low", "fixed part of TTFT, lower bound")
GAP_SHARE_TAIL = _row("gap_share_tail", "client-server gap share of TTFT (slowest 5%)")
CLIENT_SERVER_TTFT_X = _row("client_server_ttft_x", "client TTFT p50 / server TTFT p50")
DETOKENIZE_SHARE_TAIL = stage_share_tail("detokenize")
SEND_LATENESS_SHARE = _row("send_lateness_share", "sends late against the schedule p95 / TTFT p50")
COLD_OUTLIERS = _row("cold_outliers", "first requests far above comparable ones")
COLD_PENALTY_X = _row("cold_penalty_x", "first-request penalty / steady TTFT p95")
COLD_PENALTY = _row("cold_penalty", "first-request penalty")
STARTUP_SPANS = _row("startup_spans", "start-up spans")
FAILED_SHARE = _row("failed_share", "requests that failed")
FAILED_SHARE_BY_LEVEL = _row("failed_share_by_level", "failed share by load level")
FAILED_INFLIGHT_P50 = _row("failed_inflight_p50", "requests in flight when a failed request was sent (median)")
GAP_HOLDS_FRONTEND = _row("gap_holds_frontend", "requests whose engine TTFT starts after its front end")
CLIENT_FIRST_TOKEN_LAG = _row("client_first_token_lag", "client stalls at the first token / TTFT")
CLIENT_LOOP_STALLED = _row("client_loop_stalled", "client event loop stalled")
GAP_SHARE_LOCAL = _row("gap_share_local", "client-server gap / TTFT p50, server on this machine")
CLIENT_CPU_P95 = _row("client_cpu_p95", "client CPU p95")
CLIENT_SATURATED = _row("client_saturated", "client health says saturated")
COLD_FIRST_CONTACT = _row("cold_first_contact", "the probe's first request answered after")
COLD_FIRST_VS_SLO = _row("cold_first_vs_slo", "first request against the TTFT SLO")
CLIENT_LOOP_STALLED_WAITING = _row("client_loop_stalled_waiting", "client event loop stalled while requests waited")
CLIENT_LAG_OVER_GAP = _row("client_lag_over_gap", "client event-loop lag p99 / client-server gap p50")
CLIENT_OWN_PART = _row("client_own_part", "the client's own part / TTFT")
CLIENT_MACHINE_PART = _row("client_machine_part", "the machine's part / TTFT")
CLIENT_LAG_OVER_TTFT = _row("client_lag_over_ttft", "client event-loop lag p99 / TTFT p50")

# --- rules.frontend ------------------------------------------------------------------------------

GAP_RISE_X = _row("gap_rise_x", "client-server gap at the highest load / at the lowest")
ENGINE_WAITING_MAX = _row("engine_waiting_max", "engine waiting (max)")
FRONTEND_SHED = _row("frontend_shed", "requests shed or refused")
ENGINE_QUEUE_SHARE_TAIL = _row("engine_queue_share_tail", "engine queue share of TTFT (slowest 5%)")
FRONTEND_WAIT_SHARE_TAIL = _row("frontend_wait_share_tail", "front-end wait share of TTFT (slowest 5%)")
FRONTEND_HTTP_PART = _row("frontend_http_part", "of that wait, for an HTTP worker")
FRONTEND_WAIT_SHARE_P50 = _row("frontend_wait_share_p50", "front-end wait share of TTFT (median requests)")
GAP_RISE_STEPS = _row("gap_rise_steps", "its rise / ITL p50")
FRONTEND_TTFT_RISE_X = _row("frontend_ttft_rise_x", "TTFT at the highest concurrency / at the lowest")
UNSEEN_INFLIGHT = _row("unseen_inflight", "client requests in flight the engine did not count (mean over scrapes)")
UNSEEN_SHARE = _row("unseen_share", "unseen / client requests in flight")
DYNAMO_FRONTEND_SHARE = _row("dynamo_frontend_share", "front-end time / TTFT (Dynamo metrics)")
DYNAMO_FRONTEND_LESS_TOKENIZE_SHARE = _row("dynamo_frontend_less_tokenize_share",
                                           "front-end time less tokenization / TTFT (Dynamo metrics)")

# --- rules.itl -----------------------------------------------------------------------------------

ITL_OVER_TTFT = _row("itl_over_ttft", "ITL p50 / TTFT p50")
DECODE_HOLD = _row("decode_hold", "per-stream decode speed, highest / lowest concurrency")
ITL_DURING_PREFILL_X = _row("itl_during_prefill_x", "ITL during prefills / ITL otherwise")
PREFILL_STALL_SHARE = _row("prefill_stall_share", "decode time lost to prefill stalls")
GAPS_DURING_PREFILL = _row("gaps_during_prefill", "token gaps overlapping a prefill")
ITL_TAIL_DURING_PREFILL = _row("itl_tail_during_prefill", "slowest 1% of token gaps that overlap a prefill")
STALLS_ALIGNED_EXCESS = _row("stalls_aligned_excess",
                             "stalls ending as another request's first token arrives, above chance")
RUNNING_P95 = _row("running_p95", "running_seqs_p95")
DECODE_STEP_P50 = _row("decode_step_p50", "decode_step_p50_s")
ITL_P99 = _row("itl_p99", "itl_p99_s")

# --- rules.loop ----------------------------------------------------------------------------------

LOOP_IDLE_SHARE = _row("loop_idle_share", "engine loop idle while requests are inside it")
LOOP_IDLE_TTFT_SHARE = _row("loop_idle_ttft_share", "loop idle time inside TTFT")
LOOP_GAP_P50 = _row("loop_gap_p50", "gap between steps while requests wait (median)")
ITL_P50 = _row("itl_p50", "ITL p50")

# --- rules.pipeline ------------------------------------------------------------------------------

PP_IDLE_PREFILL = _row("pp_idle_prefill", "pipeline idle share of prefill step time")
PP_IDLE_TAIL = _row("pp_idle_tail", "pipeline idle share of the slowest TTFTs")
PP_MICROBATCHES = _row("pp_microbatches", "micro-batches per prefill step (median)")
PP_IDLE_ALL = _row("pp_idle_all", "pipeline idle share of all step time")
PP_SLOPE_X = _row("pp_slope_x", "TTFT per prompt token, PP / the other layout")

# --- rules.prefix_cache --------------------------------------------------------------------------

PREFIX_TOKENS = _row("prefix_tokens", "shared prefix")
PREFIX_HIT_RATIO_METRICS = _row("prefix_hit_ratio_metrics", "engine prefix-cache hit ratio (metrics)")
PREFIX_CACHING_ON = _row("prefix_caching_on", "prefix caching in the engine's configuration")
PREFIX_SAVING = _row("prefix_saving", "repeats' TTFT saving of the prefix's cost")
PREFIX_COST_SHARE = _row("prefix_cost_share", "prefix's share of a first use's TTFT")
PREFIX_CACHED_FRAC = _row("prefix_cached_frac", "repeats' cached tokens / shared prefix")
PREFILL_SHARE_TAIL = stage_share_tail("prefill")
PREFIX_FIRST_TTFT_P50 = _row("prefix_first_ttft_p50", "TTFT p50, first use of a prefix")
PREFIX_REPEAT_TTFT_P50 = _row("prefix_repeat_ttft_p50", "TTFT p50, repeats of the prefix")
PREFIX_CONTROL_TTFT_P50 = _row("prefix_control_ttft_p50", "TTFT p50, controls (suffix alone)")

# --- rules.grammar -------------------------------------------------------------------------------

SCHEMA_FIRST_ABOVE_P90 = _row("schema_first_above_p90", "first uses slower than the repeats' 90th percentile")
SCHEMA_USES = _row("schema_uses", "schema uses in the probe's design")
SCHEMA_FIRST_X = _row("schema_first_x", "TTFT of a schema's first use / its repeats (p50)")
SCHEMA_FIRST_WAIT_SHARE = _row("schema_first_wait_share", "first uses' wait share of the design's TTFT")
GRAMMAR_WAIT_SHARE = _row("grammar_wait_share", "grammar wait share of TTFT")
SCHEMA_FIRST_TTFT_P50 = _row("schema_first_ttft_p50", "TTFT p50, first use of a schema")
SCHEMA_REPEAT_TTFT_P50 = _row("schema_repeat_ttft_p50", "TTFT p50, repeats of a schema")
GRAMMAR_WAIT_P50 = _row("grammar_wait_p50", "grammar wait p50 (requests that waited)")
GRAMMAR_MISS_SHARE = _row("grammar_miss_share", "structured-output requests not served from the grammar cache")

# --- rules.lora ----------------------------------------------------------------------------------

LORA_MIX_ABOVE_P90 = _row("lora_mix_above_p90", "mixed requests slower than the one-adapter control's 90th percentile")
DEFERRED_SHARE = _row("deferred_share", "deferred share of waiting requests (engine metrics)")
LORA_OTHER_X = _row("lora_other_x", "TTFT, only other adapters in flight / own adapter in flight (p50)")
LORA_WAIT_SHARE = _row("lora_wait_share", "waits for an adapter, share of TTFT")
LORA_MIX_X = _row("lora_mix_x", "TTFT p50, all the adapters / one adapter")
LORA_SLOT_WAIT_SHARE = _row("lora_slot_wait_share", "waits for an adapter slot, share of TTFT")
LORA_LOAD_SHARE = _row("lora_load_share", "adapter loads, share of TTFT")
LORA_JOINS_TTFT_P50 = _row("lora_joins_ttft_p50", "TTFT p50, own adapter in flight")
LORA_OTHER_TTFT_P50 = _row("lora_other_ttft_p50", "TTFT p50, only other adapters in flight")
LORA_ADAPTERS_N = _row("lora_adapters_n", "adapters in the design")

# --- rules.pd ------------------------------------------------------------------------------------

PD_DECODE_TTFT_SHARE_METRICS = _row("pd_decode_ttft_share_metrics",
                                    "decode instance's own TTFT, share of both (engine metrics)")
PD_TRANSFER_SHARE = _row("pd_transfer_share", "KV transfer share of TTFT")
PD_TRANSFER_X = _row("pd_transfer_x", "KV transfer / prefill (p50)")
PD_TRANSFER_FLOOR_X = _row("pd_transfer_floor_x", "KV transfer / prefill, the fastest transfers")
PD_ADMISSION_SHARE_METRICS = _row("pd_admission_share_metrics",
                                  "decode instance's own TTFT beyond the transfer and its compute step, share of TTFT "
                                  "(engine metrics)")
PD_PREFILL_TTFT_MEAN_METRICS = _row("pd_prefill_ttft_mean_metrics", "prefill instance's own TTFT (engine metrics, mean)")
PD_DECODE_TTFT_MEAN_METRICS = _row("pd_decode_ttft_mean_metrics", "decode instance's own TTFT (engine metrics, mean)")
PD_USERS_TTFT_P50 = _row("pd_users_ttft_p50", "TTFT p50 (what the users wait)")
PD_TRANSFER_SHARE_METRICS = _row("pd_transfer_share_metrics", "KV transfer share of TTFT (engine metrics)")
PD_TRANSFER_X_METRICS = _row("pd_transfer_x_metrics", "KV transfer / prefill (engine metrics)")
PD_PREFILL_TTFT_P50 = _row("pd_prefill_ttft_p50", "prefill instance's own TTFT (p50)")
PD_DECODE_TTFT_P50 = _row("pd_decode_ttft_p50", "decode instance's own TTFT (p50)")
PD_TRANSFER_P50 = _row("pd_transfer_p50", "KV transfer (p50)")
PD_ADMISSION_WAIT_SHARE = _row("pd_admission_wait_share", "waiting for decode-side blocks or a running place")
PD_ADMISSION_SHARE = _row("pd_admission_share", "decode-side admission share of TTFT")
