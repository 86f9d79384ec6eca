"""The one catalogue of feature names: each name once, with the theme that produces it and its unit.

``CATALOG[name]`` is a :class:`FeatureSpec`. Units are from the closed set (``diag.ground.units``:
``"s"``, ``"share"``, ``"%"``, ``"x"``, ``"requests"``, ``"tokens"``, ``"steps"``,
``"tokens/s"``, ``"s/s"``, ``"bytes"``, ``"count"``, ``""``). A theme writes a feature through
``FeatureContext.add``, which takes the unit from here, so a name missing from the catalogue
fails at once. The theme is the module in :mod:`rules.features` that first writes the
feature; ``engine_metrics.series_fallback`` may later replace TTFT and stage-share features
in a series-only capture.

Three names keep milliseconds (``ttft_prompt_slope_ms_per_token``, ``ttft_prompt_intercept_ms`` and
the intercept's standard error ``ttft_prompt_intercept_se_ms``): their values are pinned by name, so
they carry ``""`` and the name says the unit.
"""

from __future__ import annotations

from dataclasses import dataclass

from diag.ground.units import Unit


@dataclass(frozen=True)
class FeatureSpec:
    """One feature name: the theme (module of :mod:`rules.features`) that produces it, and its unit."""

    name: str
    theme: str
    unit: str


#: (theme, unit, names): every feature name spelt out once
_TABLE: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("populations", "requests", ("requests_total_n", "requests_failed_n", "errors_by_kind", "sides_n", "requests_n",
                                 "cold_start_outliers_n", "cold_start_waited_n", "failed_inflight_p50",
                                 "context_limit_refused_n", "requests_lost_by_probe_n")),
    ("populations", "tokens", ("context_limit_tokens",)),
    ("populations", "share", ("error_rate", "error_rate_by_segment")),
    ("populations", "", ("client_only", "designed_by_diagnose", "designed_probe")),
    ("populations", "x", ("users_prompt_spread_x",)),
    ("populations", "tokens", ("users_prompt_mid_tokens",)),
    ("populations", "tokens", ("users_shared_prefix_tokens",)),
    ("populations", "requests", ("users_concurrency",)),
    ("populations", "s", ("cold_start_outlier_ttft_s", "cold_start_outlier_excess_s", "cold_start_s",
                          "cold_start_by_phase_s", "cold_start_first_contact_s",
                          "cold_start_not_serving_s")),
    ("engine_metrics", "count", ("metrics_windows_n",)),
    ("engine_metrics", "requests", ("metrics_requests_n",)),
    ("engine_metrics", "s", ("metrics_ttft_mean_s", "metrics_queue_time_mean_s", "metrics_tokenize_time_mean_s", "metrics_queue_time_p95_s",
                             "metrics_prefill_time_mean_s", "prefill_s_per_token")),
    ("engine_metrics", "share", ("metrics_queue_share", "metrics_prefill_share", "metrics_tokenize_share")),
    ("engine_metrics", "s/s", ("prefill_busy_ratio", "decode_busy_ratio")),
    ("engine_metrics", "tokens/s", ("prompt_tokens_per_s",)),
    ("engine_metrics", "", ("series_only",)),
    ("latency", "s", ("ttft_p50_s", "ttft_p95_s", "ttft_p99_s", "server_ttft_p50_s", "server_ttft_p95_s",
                      "server_ttft_p99_s", "client_ttft_p50_s", "client_ttft_p95_s", "client_ttft_p99_s", "ttft_mean_s",
                      "e2e_p50_s", "client_server_gap_p50_s", "client_server_gap_p95_s", "slo_checks")),
    ("latency", "x", ("client_server_ttft_ratio",)),
    ("latency", "share", ("client_server_gap_frontend_frac",)),
    ("stage_shares", "share", ("stage_shares_median", "stage_shares_tail", "stage_shares_all", "unattributed_share_tail",
                               "tokenize_share_median", "tokenize_share_tail", "queue_share_median", "queue_share_tail",
                               "prefill_share_median", "prefill_share_tail", "comm_share_median", "comm_share_tail",
                               "sample_share_median", "sample_share_tail",
                               "kv_transfer_share_median", "kv_transfer_share_tail", "detokenize_share_median",
                               "detokenize_share_tail", "lumped_share_median", "lumped_share_tail",
                               "network_share_median", "network_share_tail")),
    ("stage_shares", "s", ("stage_tail_mean_s",)),
    ("concurrency", "requests", ("inflight_at_arrival_p50", "inflight_at_arrival_max", "concurrency_knee",
                                 "long_ramp_decode_cap", "long_ramp_short_decode_cap", "long_ramp_decode_max",
                                 "long_ramp_top", "long_out_decode_max")),
    ("concurrency", "x", ("long_ramp_knee_ratio", "long_ramp_token_ratio", "long_out_output_x")),
    ("concurrency", "share", ("long_ramp_wait_share",)),
    ("concurrency", "", ("long_ramp_short_flat",)),
    ("concurrency", "tokens", ("long_ramp_prompt_tokens",)),
    ("concurrency", "s", ("ttft_by_inflight", "itl_at_top_concurrency_s", "service_s_p50")),
    ("concurrency", "x", ("ttft_concurrency_ratio", "ttft_knee_jump_ratio", "ttft_pre_knee_rise",
                          "decode_speed_hold_ratio", "ttft_inline_ratio")),
    ("concurrency", "count", ("concurrency_flat_levels",)),
    ("concurrency", "steps", ("ttft_rise_per_itl", "ttft_in_itl_steps_p50", "ttft_in_itl_steps_p95")),
    ("concurrency", "x", ("ttft_tail_prompt_x",)),
    ("concurrency", "share", ("first_token_after_end_frac", "first_token_after_end_control", "decode_alone_frac",
                                   "first_token_after_end_order_frac", "first_token_after_end_order_control")),
    ("concurrency", "requests", ("first_token_after_end_n",)),
    ("concurrency", "share", ("starts_after_end_frac", "starts_after_end_control")),
    ("concurrency", "requests", ("starts_n",)),
    ("concurrency", "tokens/s", ("decode_speed_by_inflight",)),
    ("prompt_fit", "", ("ttft_prompt_slope_ms_per_token", "ttft_prompt_intercept_ms", "ttft_prompt_intercept_se_ms",
                        "ttft_prompt_slope_t")),
    ("prompt_fit", "share", ("ttft_prompt_r2", "ttft_prompt_explained_frac")),
    ("prompt_fit", "requests", ("ttft_prompt_fit_n",)),
    ("prompt_fit", "count", ("prompt_sweep_points_n",)),
    ("prompt_fit", "share", ("ttft_prompt_fit_alone_frac",)),
    ("prompt_fit", "s", ("ttft_prompt_fit_ttft_p50_s", "ttft_prompt_fit_itl_p50_s")),
    ("prompt_fit", "x", ("prompt_slope_per_itl",)),
    ("prompt_fit", "steps", ("prompt_work_steps_p50",)),
    ("device", "share", ("device_busy_frac", "engine_busy_frac", "device_busy_frac_while_queued", "kv_usage_p95",
                         "kv_usage_max", "kv_time_above_high_frac", "preempted_requests_frac", "comm_share_of_prefill", "comm_share_tp_ttft",
                         "cpu_profile_shares")),
    ("device", "s", ("engine_step_p50_s", "engine_step_in_flight_s", "decode_step_p50_s", "ttft_by_tp")),
    ("device", "count", ("preemptions_total", "tp_size")),
    ("device", "requests", ("waiting_seqs_p95", "waiting_seqs_max", "running_seqs_p95", "running_seqs_max")),
    ("device", "x", ("tp_ttft_ratio", "ttft_vs_engine_prefill_ratio")),
    ("device", "share", ("waiting_at_cap_frac", "waiting_for_capacity_share", "kv_blocked_steps_frac")),
    ("itl", "s", ("itl_p50_s", "itl_p90_s", "itl_p99_s", "itl_max_s", "tpot_p50_s", "tpot_p99_s",
                  "itl_during_prefill_p50_s", "itl_during_prefill_mean_s", "itl_without_prefill_p50_s",
                  "itl_mixed_slo")),
    ("itl", "x", ("itl_interference_ratio",)),
    ("itl", "share", ("itl_prefill_stall_share", "itl_tail_during_prefill_frac", "itl_during_prefill_frac")),
    ("itl", "count", ("itl_tail_gaps_n", "itl_stall_gaps_n")),
    ("itl", "share", ("itl_stall_end_first_token_frac", "itl_stall_end_first_token_chance")),
    ("itl", "share", ("stream_stall_frac",)),
    ("itl", "steps", ("stream_stall_steps_p50",)),
    ("itl", "requests", ("stream_stall_n",)),
    ("client", "", ("client_health_flags", "client_saturated_flag", "client_server_local")),
    ("client", "share", ("client_loop_stall_frac", "client_first_token_lag_share", "client_first_token_own_lag_share",
                         "client_first_token_starved_share")),
    ("client", "s", ("client_loop_lag_p99_s", "client_slot_wait_p95_s", "client_send_lateness_p95_s")),
    ("client", "%", ("client_cpu_pct_p95",)),
    # frontend (rules/features/frontend.py): waits before the engine sees a request
    ("frontend", "share", ("frontend_wait_share_tail", "frontend_wait_share_median", "frontend_http_wait_frac",
                           "metrics_frontend_share", "engine_unseen_share")),
    ("frontend", "s", ("frontend_wait_p50_s", "client_server_gap_by_inflight")),
    ("frontend", "x", ("client_server_gap_concurrency_ratio",)),
    ("frontend", "steps", ("client_server_gap_rise_per_itl",)),
    ("frontend", "requests", ("engine_unseen_inflight",)),
    # loop (rules/features/loop.py): the engine's step loop idle while requests wait inside it
    ("loop", "share", ("loop_idle_share", "loop_idle_share_of_ttft", "loop_idle_share_of_ttft_tail")),
    ("loop", "s", ("loop_gap_p50_s",)),
    ("loop", "count", ("loop_gaps_n",)),
    # grammar (rules/features/grammar.py): structured-output grammar compilation before scheduling
    ("grammar", "s", ("schema_first_ttft_p50_s", "schema_repeat_ttft_p50_s", "grammar_wait_p50_s")),
    ("grammar", "x", ("schema_first_ttft_x",)),
    ("grammar", "share", ("schema_wait_share_of_ttft", "schema_first_above_repeat_frac", "grammar_miss_frac",
                          "grammar_wait_share_of_ttft",
                          "grammar_wait_share_of_ttft_tail")),
    ("grammar", "requests", ("schema_first_n", "schema_repeat_n", "schema_concurrent_n", "grammar_requests_n")),
    # pd (rules/features/pd.py): disaggregated prefill/decode, the hand-off between the two sides
    ("pd", "share", ("pd_transfer_share", "pd_transfer_share_tail", "pd_decode_queue_share",
                     "pd_decode_queue_share_tail", "pd_admission_share")),
    ("pd", "s", ("pd_prefill_ttft_p50_s", "pd_decode_ttft_p50_s", "pd_transfer_p50_s", "pd_metrics_prefill_ttft_s",
                 "pd_metrics_decode_ttft_s")),
    ("pd", "requests", ("pd_requests_n",)),
    ("pd", "x", ("pd_transfer_vs_prefill_x", "pd_transfer_floor_vs_prefill_x", "pd_metrics_transfer_vs_prefill_x")),
    ("pd", "share", ("pd_metrics_decode_ttft_share", "pd_metrics_transfer_share", "pd_metrics_admission_share")),
    # lora (rules/features/lora.py): LoRA adapter slots, deferred waits
    ("lora", "s", ("lora_other_ttft_p50_s", "lora_joins_ttft_p50_s")),
    ("lora", "x", ("lora_other_ttft_x", "lora_mix_ttft_x")),
    ("lora", "share", ("lora_wait_share_of_ttft", "waiting_deferred_share", "lora_mix_wait_share",
                       "lora_mix_above_control_frac")),
    ("lora", "requests", ("lora_joins_n", "lora_other_n", "lora_mix_n", "lora_server_requests_n")),
    ("lora", "share", ("lora_slot_wait_share", "lora_slot_wait_share_tail", "lora_load_share")),
    ("lora", "count", ("lora_adapters_n",)),
    # pipeline (rules/features/pipeline.py): pipeline-parallel bubbles
    ("pipeline", "share", ("pp_bubble_share_of_prefill", "pp_bubble_share_of_steps", "pp_bubble_share_tail")),
    ("pipeline", "count", ("pp_size", "pp_microbatches_p50")),
    ("pipeline", "s", ("ttft_by_parallelism",)),
    ("pipeline", "x", ("pp_vs_tp_ttft_ratio",)),
    # admission (rules/features/admission.py): head-of-line behind long prompts, KV reservation
    ("admission", "x", ("hol_short_ttft_ratio", "hol_long_prompt_ratio")),
    ("admission", "share", ("hol_wait_share_all", "hol_blocked_lost_frac", "hol_unblocked_lost_frac")),
    ("admission", "requests", ("hol_blocked_short_n", "hol_unblocked_short_n", "hol_blocked_running_max", "running_cap",
                               "kvr_running_while_waiting_p50")),
    ("admission", "share", ("hol_blocked_queue_share", "hol_blocked_kv_usage_max", "kvr_waiting_steps_frac",
                            "kvr_kv_usage_while_waiting_p95", "kvr_prefill_steps_while_waiting_frac",
                            "kvr_prefill_bound_while_waiting_frac")),
    ("admission", "steps", ("hol_blocked_wait_steps", "hol_blocked_others_steps")),
    ("admission", "", ("hol_baseline_own_wait", "mixed_by_diagnose")),
    # prefix cache (rules/features/prefix_cache.py): repeats of the probe's shared prefix, cached tokens
    ("prefix_cache", "s", ("prefix_first_ttft_p50_s", "prefix_repeat_ttft_p50_s", "prefix_control_ttft_p50_s")),
    ("prefix_cache", "share", ("prefix_cost_share", "prefix_repeat_saving_frac", "prefix_repeat_cached_frac",
                               "prefix_cached_tokens_frac", "prefix_cache_hit_ratio_metrics",
                               "prefix_metrics_cached_frac")),
    ("prefix_cache", "tokens", ("prefix_shared_tokens",)),
    ("prefix_cache", "requests", ("prefix_first_n", "prefix_repeat_n", "prefix_control_n")),
    ("prefix_cache", "", ("prefix_caching_enabled",)),
    ("populations", "", ("engines_seen",)),
    # floor (rules/features/floor.py): a request's own work on this server, and TTFT against it
    ("floor", "s", ("ttft_floor_p50_s",)),
    ("floor", "x", ("ttft_over_floor_p50", "ttft_over_floor_p90")),
    ("floor", "requests", ("ttft_floor_n", "ttft_floor_compared_n")),
)


def _build() -> dict[str, FeatureSpec]:
    out: dict[str, FeatureSpec] = {}
    closed = {u.value for u in Unit}
    for theme, unit, names in _TABLE:
        if unit not in closed:
            raise ValueError(f"unit {unit!r} of {names[0]} is not in the closed set (diag.ground.units.Unit)")
        for name in names:
            if name in out:
                raise ValueError(f"feature {name} is catalogued twice")
            out[name] = FeatureSpec(name, theme, unit)
    return out


#: feature name -> its spec
CATALOG: dict[str, FeatureSpec] = _build()

__all__ = ["CATALOG", "FeatureSpec"]
