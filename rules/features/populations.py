"""Theme: who counts. Requests by outcome (completed, failed, warm-up), the client/server sides,
the steady population (cold-start outliers taken out), the cold-start spans reported apart, and
whether the load was ``ttft diagnose``'s design and what the users said they send.

Writes ``ctx.ok`` and ``ctx.steady`` (every later theme reads them). Units: counts of requests,
seconds.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from diag.ground import stages
from rules.features.context import FeatureContext
from rules.features.numeric import bool_col, num_col


def engines_seen(ctx: FeatureContext) -> dict[str, float]:
    """``engines_seen``: the request rows' ``engine`` (with how many requests) and the engine the
    metrics scrape detected (``meta.json`` ``prometheus_scrape`` / ``prometheus_api``: 0 requests)."""
    out: dict[str, float] = {}
    req = ctx.req_all
    if len(req) and "engine" in req.columns and "has_server" in req.columns:
        for name, n in req.loc[req["has_server"].astype(bool), "engine"].dropna().astype(str).value_counts().items():
            out[name] = float(n)
    meta = ctx.meta if isinstance(ctx.meta, dict) else {}
    for key in ("prometheus_scrape", "prometheus_api"):
        eng = meta.get(key, {}).get("engine") if isinstance(meta.get(key), dict) else None
        if eng:
            out.setdefault(str(eng), 0.0)
    return out


#: error kinds of requests the probe itself lost, never the server's failures: a Ray worker that
#: died with them in flight (collectors.probe.ray_workers), the run's own end or interruption
PROBE_LOST: tuple[str, ...] = ("worker_lost", "cancelled")


def populations(ctx: FeatureContext) -> None:
    """Request counts, error rate, sides; the ok and steady populations (writes ``ctx.ok``, ``ctx.steady``).
    Requests refused at a designed experiment's context limit (:func:`experiment_limit_rows`)
    are neither failures nor measured requests: ``context_limit_refused_n`` counts them; nor are
    requests the probe itself lost (:data:`PROBE_LOST`: a worker that died, the run's own end):
    ``requests_lost_by_probe_n``."""
    req = ctx.req_all
    n_total = len(req)
    warm = bool_col(req, "warmup")
    err = req["error"].notna() if "error" in req.columns else pd.Series(False, index=req.index)
    if "error" in req.columns:
        err &= req["error"].astype(str).str.len() > 0
    limit = experiment_limit_rows(req, ctx.meta)
    err &= ~limit  # the experiment's own limit, not the server failing: counted apart
    lost = req["error"].astype(object).isin(PROBE_LOST).fillna(False) if "error" in req.columns else limit & False
    ctx.add("requests_lost_by_probe_n", float((lost & ~warm).sum()))
    err &= ~lost
    limit = limit | lost  # neither a failure nor a measured request
    context_limit(ctx, limit & ~warm)
    ttft = num_col(req, "ttft_s")
    ok = req.loc[~warm & ~err & ttft.notna() & (ttft >= 0)]
    ctx.ok = ok.sort_values("start_ns", kind="stable").reset_index(drop=True) if len(ok) else ok
    counted = ~warm & ~limit  # the measured requests, the experiment's own refusals apart
    measured = req.loc[counted]
    ctx.add("requests_total_n", float(len(measured)))
    seen = engines_seen(ctx)
    ctx.add("engines_seen", seen or None, None if seen else "no engine named in the capture")
    ctx.add("requests_failed_n", float(int(err[counted].sum())))
    ctx.add("error_rate", float(err[counted].mean()) if len(measured) else None,
            None if len(measured) else "no requests in the capture")
    kinds = req.loc[err & counted, "error"].astype(str).value_counts().head(10) if "error" in req.columns else pd.Series(dtype=int)
    ctx.add("errors_by_kind", {str(k): int(v) for k, v in kinds.items()})
    errors_by_segment(ctx, err & counted, counted)
    has_server = bool_col(req, "has_server")
    has_client = bool_col(req, "has_client")
    ctx.add("sides_n", {"server": int(has_server.sum()), "client": int(has_client.sum()),
                        "joined": int((has_server & has_client).sum()), "total": n_total})
    server_side = bool(has_server.any())
    client_side = bool(has_client.any())
    ctx.add("client_only", 1.0 if (client_side and not server_side) else 0.0)
    # the load is ttft diagnose's designed experiment (its ladder, ramp and follow-ups), not the users'
    ctx.add("designed_by_diagnose", 1.0 if isinstance(ctx.meta, dict) and ctx.meta.get("kind") == "diagnose" else 0.0)
    ctx.add("designed_probe", 1.0 if designed_probe(ctx.meta) or labelled_sweep(ctx.ok) else 0.0)
    users_workload(ctx)
    cold_start_outliers(ctx)
    designed_apart(ctx)
    ctx.add("requests_n", float(len(ctx.steady)))


def designed_probe(meta: Any) -> bool:
    """Whether the probe ran a designed experiment: a ``--sweep`` (one thing varied per point), a
    ``--shared-prefix`` design (first uses, repeats, controls) or ``--inject-long`` (long prompts
    among short ones at a set rhythm)."""
    if not isinstance(meta, dict):
        return False
    if isinstance(meta.get("sweep"), dict):
        return True
    work = ((meta.get("probe") or {}).get("workload") or {}) if isinstance(meta.get("probe"), dict) else {}
    return bool(work.get("inject_long")) or bool(work.get("shared_prefix_repeats"))


#: a sweep point's label, as ``ttft probe --sweep`` writes it: kind and value
SWEEP_LABEL = r"^(prompt|concurrency|rate)=([0-9.]+)$"


def labelled_sweep(req: pd.DataFrame) -> bool:
    """Whether most requests (80%) carry sweep labels (``prompt=N``, ``concurrency=N``, ``rate=N``) of
    one kind with at least 3 points: a sweep the capture records even where its meta.json does not say so."""
    if len(req) == 0 or "segment" not in req.columns:
        return False
    parts = req["segment"].astype(str).str.extract(SWEEP_LABEL)
    kinds = parts[0].fillna("")
    return any(kinds.eq(kind).mean() >= 0.8 and parts.loc[kinds.eq(kind), 1].nunique() >= 3
               for kind in ("prompt", "concurrency", "rate"))


def experiment_limit_rows(req: pd.DataFrame, meta: dict | None) -> pd.Series:
    """Requests refused at the probe's own limit: ``http_4xx`` answers in the segments where a
    designed experiment (a prompt sweep, diagnose's ladder) found its prompts longer than the
    server's context (``meta.json`` ``probe.context_limit.refused_segments``). The probe chose
    those lengths: the refusals are the experiment's limit, not the server failing. A refusal of
    a length the user chose (no such record) stays a failure."""
    none = pd.Series(False, index=req.index)
    probe = meta.get("probe") if isinstance(meta, dict) else None
    limit = probe.get("context_limit") if isinstance(probe, dict) else None
    segs = limit.get("refused_segments") if isinstance(limit, dict) else None
    if not segs or not len(req) or "segment" not in req.columns or "error" not in req.columns:
        return none
    return (req["segment"].astype(object).isin([str(x) for x in segs]) & (req["error"].astype(object) == "http_4xx")).fillna(False)


def context_limit(ctx: FeatureContext, refused: pd.Series) -> None:
    """``context_limit_refused_n``: measured requests refused at the experiment's context limit
    (:func:`experiment_limit_rows`); ``context_limit_tokens``: the limit the server stated (or
    the shortest prompt it refused as too long)."""
    probe = ctx.meta.get("probe") if isinstance(ctx.meta, dict) else None
    limit = probe.get("context_limit") if isinstance(probe, dict) else None
    limit = limit if isinstance(limit, dict) else {}
    why = "no designed experiment met the server's context limit (meta.json probe.context_limit)"
    ctx.add("context_limit_refused_n", float(int(refused.sum())) if limit else None, None if limit else why)
    tokens = limit.get("context_limit_tokens") or limit.get("refused_prompt_tokens")
    ok = isinstance(tokens, (int, float)) and tokens > 0
    ctx.add("context_limit_tokens", float(tokens) if ok else None, None if ok else why)


def users_workload(ctx: FeatureContext) -> None:
    """What the users send, as ``ttft diagnose --workload`` recorded it (``meta.json``
    ``users_workload``): ``users_prompt_spread_x`` (their longest prompt / shortest),
    ``users_prompt_mid_tokens`` (the middle of their range),
    ``users_shared_prefix_tokens`` (0: none) and ``users_concurrency`` (the most requests they keep
    in flight). Unavailable when not given."""
    wl = ctx.meta.get("users_workload") if isinstance(ctx.meta, dict) else None
    wl = wl if isinstance(wl, dict) else {}
    why = "the users' workload is not given (ttft diagnose --workload {})"
    pt = wl.get("prompt_tokens")
    ok = isinstance(pt, list) and len(pt) == 2 and all(isinstance(x, (int, float)) and x > 0 for x in pt)
    ctx.add("users_prompt_spread_x", float(pt[1]) / float(pt[0]) if ok else None,
            None if ok else why.format("prompt_tokens=MIN-MAX"))
    ctx.add("users_prompt_mid_tokens", (float(pt[0]) + float(pt[1])) / 2.0 if ok else None,
            None if ok else why.format("prompt_tokens=MIN-MAX"))
    if ok:
        ctx.users_prompt_tokens = (float(pt[0]), float(pt[1]))
    sp = wl.get("shared_prefix_tokens")
    ok = isinstance(sp, (int, float)) and sp >= 0
    ctx.add("users_shared_prefix_tokens", float(sp) if ok else None, None if ok else why.format("shared_prefix=N"))
    conc = wl.get("concurrency")
    ok = isinstance(conc, (int, float)) and conc >= 1
    ctx.add("users_concurrency", float(conc) if ok else None, None if ok else why.format("concurrency=N"))


def designed_apart(ctx: FeatureContext) -> None:
    """Move ttft diagnose's designed experiments from ``ctx.steady``: the long ramp (segments
    ``long=N``) to ``ctx.long_ramp``, its longer answers (``longout=N``) to ``ctx.long_out``, the mixed
    follow-up (``mixed=N``) to ``ctx.mixed``, the grammar and LoRA follow-ups (``grammar=R``, ``lora=C``)
    to ``ctx.grammar_design`` and ``ctx.lora_design`` (unless no other labelled segment is beside it:
    a probe of that design alone). They send what the users may never send (or at a load of their own); each is
    read by its own features only."""
    st = ctx.steady
    if len(st) == 0 or "segment" not in st.columns:
        return
    seg = st["segment"].astype(str)
    labelled = st["segment"].notna()
    keep = pd.Series(True, index=st.index)
    for attr, name in (("long_ramp", stages.SEGMENT_LONG_RAMP), ("long_out", stages.SEGMENT_LONG_OUT),
                       ("mixed", stages.SEGMENT_MIXED), ("grammar_design", stages.SEGMENT_GRAMMAR),
                       ("lora_design", stages.SEGMENT_LORA)):
        mine = seg.str.startswith(name + "=")
        if attr in ("grammar_design", "lora_design") and not (labelled & ~mine).any():
            continue  # no other experiment beside it (ttft probe --lora alone): it is the steady population
        if mine.any():
            setattr(ctx, attr, st.loc[mine].reset_index(drop=True))
            keep &= ~mine
    if not keep.all():
        ctx.steady = st.loc[keep].reset_index(drop=True)


def errors_by_segment(ctx: FeatureContext, err: pd.Series, measured: pd.Series) -> None:
    """Failed share of requests per segment (load level), and the requests in flight when failures started.

    ``error_rate_by_segment``: {segment: failed / sent} over segments with a failure;
    ``failed_inflight_p50``: median requests in flight at a failed request's start (itself
    included). Units: shares, requests.
    """
    req = ctx.req_all
    if not bool(err.any()):
        ctx.na(("error_rate_by_segment", "failed_inflight_p50"), "no failed requests")
        return
    seg = (req["segment"].astype(object).where(req["segment"].notna(), "(none)").astype(str) if "segment" in req.columns
           else pd.Series("(none)", index=req.index))
    rate = err[measured].groupby(seg[measured]).mean()
    ctx.add("error_rate_by_segment", {str(k): float(v) for k, v in rate.items() if v > 0})
    start = num_col(req, "start_ns").to_numpy()
    e2e = num_col(req, "e2e_s").to_numpy()
    dur = np.where(np.isfinite(e2e), e2e, 0.0)
    good = np.isfinite(start)
    s = np.sort(start[good])
    e = np.sort(start[good] + dur[good] * 1e9)
    q = start[err.to_numpy() & good]
    n = np.searchsorted(s, q, side="right") - np.searchsorted(e, q, side="left")
    ctx.add("failed_inflight_p50", float(np.median(np.maximum(n, 1))) if len(n) else None,
            None if len(n) else "failed requests carry no start time")


def cold_start_outliers(ctx: FeatureContext) -> None:
    """First requests far above comparable ones: counted apart, removed from ``ctx.steady``.

    The first ``max(3, 2%)`` requests are tested against the rest; when some are outliers, so is
    the backlog behind them: any later request sent before the last outlier's first token, and
    as far above the requests sent after that moment (open-loop arrivals keep coming while the
    model loads). With cold_start spans (server side), a request sent before start-up ended
    that got its first token after it waited for start-up by the engine's own account. The
    probe's first contact (API detection or compatibility check, before the run and not one of
    its requests) counts as one more when it was answered far above the shortest prompts' TTFT.
    """
    not_serving, seen = _not_serving(ctx)
    ctx.add("cold_start_not_serving_s", not_serving, None if not_serving is not None else
            "the probe did not wait for the server (or the capture does not say: meta.json probe.ready)",
            source=seen or None)
    ok = ctx.ok
    n = len(ok)
    ctx.steady = ok
    names = ("cold_start_outliers_n", "cold_start_outlier_ttft_s", "cold_start_outlier_excess_s",
             "cold_start_first_contact_s")
    if n < 6:
        ctx.add("cold_start_outliers_n", 0.0 if n else None,
                None if n else "no completed requests")
        ctx.na(names[1:], f"too few requests ({n}) to tell first requests from the rest" if n else "no completed requests")
        return
    ttft = num_col(ok, "ttft_s").to_numpy()
    tokens = num_col(ok, "input_tokens").to_numpy()
    start = num_col(ok, "start_ns").to_numpy()
    first = start + ttft * 1e9
    factor = float(ctx.params["cold_start_factor"])
    head_n = int(min(50, max(3, math.ceil(0.02 * n))))
    out = _far_above(ttft, tokens, range(head_n), np.arange(head_n, n), factor)
    for i in _waited_for_startup(ctx, start, first):
        out.setdefault(i, _far_above(ttft, tokens, [i], np.arange(head_n, n), 0.0).get(i, 0.0))
    while out:  # the backlog: sent before the last outlier's first token
        boundary = max(first[i] for i in out)
        after = np.flatnonzero(start >= boundary)
        cand = [i for i in np.flatnonzero(start < boundary) if i not in out]
        if len(after) < 3 or not cand:
            break
        more = _far_above(ttft, tokens, cand, after, factor)
        if not more:
            break
        out.update(more)
    contact = _first_contact(ctx)
    contact_excess = _far_above_steady(contact, ttft, tokens, factor) if contact is not None else None
    ctx.add("cold_start_first_contact_s", contact, None if contact is not None else
            "the probe's first answered request is not in this window (or the capture does not say: meta.json "
            "probe.first_contact)")
    worst = [float(ttft[i]) for i in out] + ([contact] if contact_excess else [])
    excess = list(out.values()) + ([contact_excess] if contact_excess else [])
    ctx.add("cold_start_outliers_n", float(len(worst)))
    if out:
        ctx.steady = ok.drop(index=ok.index[sorted(out)]).reset_index(drop=True)
    ctx.add("cold_start_outlier_ttft_s", max(worst, default=0.0))
    ctx.add("cold_start_outlier_excess_s", max(excess, default=0.0))


def _far_above(ttft: np.ndarray, tokens: np.ndarray, which, pool: np.ndarray, factor: float) -> dict[int, float]:
    """{i: excess s} for the requests ``which`` whose TTFT is above ``factor`` x the median of
    comparable requests in ``pool`` (prompts within 0.5..2x, else all of it) and above its p99."""
    ref_ttft = ttft[pool]
    ref_tok = tokens[pool]
    ref_ttft_ok = np.isfinite(ref_ttft)
    if not ref_ttft_ok.any():
        return {}
    med_all = float(np.median(ref_ttft[ref_ttft_ok]))
    p99 = float(np.percentile(ref_ttft[ref_ttft_ok], 99))
    out: dict[int, float] = {}
    for i in which:
        ref = med_all
        tok_i = tokens[i]
        if np.isfinite(tok_i) and tok_i > 0:
            near = ref_ttft_ok & (ref_tok >= 0.5 * tok_i) & (ref_tok <= 2 * tok_i)
            if near.sum() >= 3:
                ref = float(np.median(ref_ttft[near]))
        if ttft[i] > factor * ref and ttft[i] > p99:
            out[int(i)] = float(ttft[i] - ref)
    return out


def _probe_meta(ctx: FeatureContext, key: str) -> dict | None:
    """meta.json ``probe.<key>`` (what the probe recorded before its run), when it is there."""
    probe = ctx.meta.get("probe") if isinstance(ctx.meta, dict) else None
    block = probe.get(key) if isinstance(probe, dict) else None
    return block if isinstance(block, dict) else None


def _first_contact(ctx: FeatureContext) -> float | None:
    """Seconds the server took to answer the probe's first generation request (API detection or
    the compatibility check, sent before the run: meta.json ``probe.first_contact``), when it
    was sent inside the window; a server still loading its model answers it late."""
    fc = _probe_meta(ctx, "first_contact")
    if fc is None:
        return None
    answer, sent = fc.get("answer_s"), fc.get("sent_ns")
    if not isinstance(answer, (int, float)) or not math.isfinite(answer):
        return None
    if ctx.window_ns is not None and not (isinstance(sent, (int, float)) and ctx.window_ns[0] <= sent < ctx.window_ns[1]):
        return None
    return float(answer)


def _not_serving(ctx: FeatureContext) -> tuple[float | None, str]:
    """(seconds, what was seen) the server was not serving when the probe first contacted it
    (connection refused, HTTP 503 "Loading model": meta.json ``probe.ready``, written when the
    probe waited for it); 0 s when it served at once. Start-up, reported apart: no request of
    the run waited for it."""
    ready = _probe_meta(ctx, "ready")
    if ready is None:
        return None, ""
    value, seen = ready.get("not_serving_s"), ready.get("seen")
    if not isinstance(value, (int, float)) or not math.isfinite(value):
        return None, ""
    return float(value), ", then ".join(str(x) for x in seen) if isinstance(seen, list) else ""


def _far_above_steady(answer_s: float, ttft: np.ndarray, tokens: np.ndarray, factor: float) -> float | None:
    """Excess seconds of a short first request (1-2 tokens out) over the run's shortest prompts'
    median TTFT (prompts up to 2x the shortest, else every request), when it is above ``factor``
    x that and above every request's p99; else None."""
    ok = np.isfinite(ttft)
    if ok.sum() < 3:
        return None
    ref = float(np.median(ttft[ok]))
    tok_ok = ok & np.isfinite(tokens) & (tokens > 0)
    if tok_ok.any():
        short = tok_ok & (tokens <= 2 * tokens[tok_ok].min())
        if short.sum() >= 3:
            ref = float(np.median(ttft[short]))
    if answer_s > factor * ref and answer_s > float(np.percentile(ttft[ok], 99)):
        return answer_s - ref
    return None


def _waited_for_startup(ctx: FeatureContext, start: np.ndarray, first: np.ndarray) -> list[int]:
    """Requests sent before the cold_start spans ended that got their first token after (indices of ``ctx.ok``)."""
    cs = ctx.tables.cold_starts
    if cs is None or len(cs) == 0 or "end_ns" not in cs.columns:
        return []
    end_ns = float(pd.to_numeric(cs["end_ns"], errors="coerce").max())
    if not np.isfinite(end_ns):
        return []
    return [int(i) for i in np.flatnonzero((start < end_ns) & (first > end_ns))]


def cold_start_spans(ctx: FeatureContext) -> None:
    """Start-up time (model load, warm-up) from the cold_start spans, in seconds, by phase."""
    cs = ctx.tables.cold_starts
    if cs is None or len(cs) == 0:
        ctx.add("cold_start_s", 0.0, source="no cold_start spans")
        ctx.add("cold_start_by_phase_s", {})
        ctx.na(("cold_start_waited_n",), "no cold_start spans")
        return
    d = pd.to_numeric(cs["duration_s"], errors="coerce").fillna(0)
    phase = cs["phase"].fillna("unknown").astype(str) if "phase" in cs.columns else pd.Series("unknown", index=cs.index)
    ctx.add("cold_start_s", float(d.sum()), source="cold_start spans")
    ctx.add("cold_start_by_phase_s", {str(k): float(v) for k, v in d.groupby(phase).sum().items()})
    # requests that arrived before start-up ended and got their first token after it: they waited for it
    end_ns = float(pd.to_numeric(cs["end_ns"], errors="coerce").max())
    ok = ctx.ok
    if len(ok) == 0 or not np.isfinite(end_ns):
        ctx.add("cold_start_waited_n", 0.0)
        return
    start = num_col(ok, "start_ns").to_numpy()
    first = start + num_col(ok, "ttft_s").to_numpy() * 1e9
    ctx.add("cold_start_waited_n", float(int(((start < end_ns) & (first > end_ns)).sum())))
