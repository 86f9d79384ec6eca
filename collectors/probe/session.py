"""The probe session: resolve the endpoint, run phases (one probe, or sweep points) on one
client, write the capture (client spans, client-health series, server-side series) and
meta.json, and compute the metrics. Its configuration and result types are in
:mod:`.session_types`, the front door (:func:`run_probe`, :func:`run_sweep`) in :mod:`.run`.

Threading: a :class:`ProbeSession` runs on one event loop (:func:`.eventloop.run`, uvloop when
installed, in :func:`.run.run_probe` / :func:`.run.run_sweep`, or the caller's loop with the
``*_async`` forms). With ``workers > 1`` each phase runs in spawned processes, with
``ray_address`` on Ray actors (:mod:`.ray_workers`, started at the first phase and kept for the
session), awaited from a thread-pool thread so the loop stays free.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from collectors.probe import eventloop
from collectors.probe import health as health_mod
from collectors.probe.affinity import available_cpus
from collectors.probe.alongside import Alongside
from collectors.probe.client import (OPTIONAL_ELEMENT_TEXT, OPTIONAL_ELEMENTS, Endpoint, RequestResult, StreamingClient,
                                     auth_headers, resolve_endpoint, split_url)
from collectors.probe.load import PROBE_PROVIDER, LoadSpec, PhaseOutcome, run_phase, run_phase_in_workers
from collectors.probe.metrics import DEFINITIONS, compute_metrics
from collectors.probe.ready import NOT_SERVING_STATUSES, ReadyWait, wait_until_serving
from collectors.probe.session_types import ProbeConfig
from collectors.probe.spans_io import drain_span_lines
from collectors.probe.workload import TokenCounter, Workload
from collectors.spans import TraceSink, setup_tracing
from diag.ground import stages
from diag.ground.capture import CaptureWriter

#: Flush in-memory spans into the capture every this many finished requests (bounds memory;
#: each flush is a short pause on the loop, visible in the loop-lag series).
FLUSH_EVERY_REQUESTS = 5000

#: 4xx answers that no optional element causes: auth, path, method, rate limits.
_NOT_ELEMENT_STATUSES = frozenset({401, 403, 404, 405, 429})


class ProbeSession:
    """One client, one capture, several phases. Use as ``async with ProbeSession(cfg) as s``."""

    def __init__(self, config: ProbeConfig, writer: CaptureWriter | None = None, pool_size: int | None = None) -> None:
        self.config = config
        self.writer = writer
        self._own_writer = writer is None
        self.pool_size = pool_size or config.load.concurrency
        self.notes: list[str] = []
        self.results: list[RequestResult] = []
        self.segments: list[tuple[str, dict[str, Any]]] = []
        self.health_samples: list[health_mod.HealthSamples] = []
        self.phase_spans: list[tuple[int, int]] = []
        self.tokenizer = TokenCounter(config.tokenizer_path) if config.tokenizer_path else None
        self.workload = Workload(config.workload, self.tokenizer)
        self.endpoint: Endpoint | None = None
        self.client: StreamingClient | None = None
        self.sink: TraceSink | None = None
        self.monitor: health_mod.HealthMonitor | None = None
        self.alongside = Alongside(config.metrics_url, config.gpu)
        self._done_in_phase = 0
        self._since_flush = 0
        self.dropped: frozenset[str] = frozenset(config.dropped) | (
            frozenset() if config.workload.exact_output else frozenset({"exact_output"}))
        #: what the compatibility check found (meta.json ``probe.compat``)
        self.compat: dict[str, Any] = {}
        #: the wait for a server not serving yet (meta.json ``probe.ready``; None without --wait-ready)
        self.ready: ReadyWait | None = None
        #: where a designed experiment met the server's context limit (meta.json ``probe.context_limit``)
        self.context_limit: dict[str, Any] | None = None
        #: the Ray actors the phases run on (``config.ray_address``; started at the first phase, or
        #: those a run of sessions keeps: ray_workers.kept) and whether they are this session's to close
        self.ray_workers: Any = None
        self._own_ray_workers = True

    # --- lifecycle --------------------------------------------------------------------------

    async def __aenter__(self) -> ProbeSession:
        cfg = self.config
        ready: ReadyWait | None = None
        if cfg.wait_ready_s > 0:
            ready = await wait_until_serving(split_url(cfg.url)[0], cfg.wait_ready_s, auth_headers(cfg.api_key),
                                             cfg.on_wait)
        self.endpoint, notes = await resolve_endpoint(cfg.url, cfg.api, cfg.model, cfg.api_key,
                                                      timeout_s=min(cfg.timeout_s, 30.0), ready=ready)
        self.ready = ready
        self.notes.extend(notes)
        if self.writer is None and cfg.output is not None:
            self.writer = CaptureWriter(cfg.output)
        self.sink = setup_tracing(service_name="ttft-probe", memory=True, otlp_endpoint=cfg.otlp_endpoint,
                                  provider_name=PROBE_PROVIDER)
        self._write_meta_start()
        self._record_ready()
        self._record_first_contact()
        count = self.tokenizer.count if self.tokenizer is not None else None
        self.client = StreamingClient(self.endpoint, self.pool_size, **self._client_kwargs(), sink=self.sink)
        self.client.count_tokens = count
        try:
            await self.client.open()
            if cfg.compat_check:
                await self._check_compat()
            if ready is not None and ready.seen:
                self.notes.append(ready.line())
            if self.tokenizer is None and not cfg.workload.prompts_file:
                await self._calibrate()
            self.monitor = health_mod.HealthMonitor()
            self.monitor.start()
            self.alongside.start()
        except BaseException:  # an error or Ctrl-C while starting: close what is open (session, spans, capture)
            await self.close()
            raise
        return self

    async def _check_compat(self) -> None:
        """One short warm-up request; when the server refuses it with a 4xx, retry without each
        optional element in turn (then without all of them) and keep the run going without
        what the server refused. The finding goes into the notes (one line, with the flag that
        turns the element off) and into meta.json ``probe.compat``."""
        from collectors.probe.workload import PromptItem

        assert self.client is not None
        item = PromptItem(prompt=self.workload.calibration_text(16), max_tokens=2)
        first = await self.client.request(item, "compat-0", "compat", warmup=True)
        while (first.status in NOT_SERVING_STATUSES and self.ready is not None
               and await self.ready.again(first.error_detail or f"HTTP {first.status}")):
            self._record_ready()
            first = await self.client.request(item, "compat-0", "compat", warmup=True)
        self.compat = {"first_status": first.status, "first_error": first.error, "dropped": sorted(self.dropped),
                       "refused": []}
        if self.endpoint is not None and self.endpoint.first_contact is None and first.error is None and first.last_ns:
            self.endpoint.first_contact = {"request": "compat", "sent_ns": first.start_ns,
                                           "answer_s": (first.last_ns - first.start_ns) / 1e9,
                                           "output_tokens": item.max_tokens}
            self._record_first_contact()
        if first.error != "http_4xx" or first.status in _NOT_ELEMENT_STATUSES:
            self._record_compat()
            return
        base = self.dropped
        candidates = [e for e in OPTIONAL_ELEMENTS if e not in base]
        trials = [frozenset({e}) for e in candidates] + ([frozenset(candidates)] if len(candidates) > 1 else [])
        refused: frozenset[str] | None = None
        for i, extra in enumerate(trials, 1):
            self.client.dropped = base | extra
            res = await self.client.request(item, f"compat-{i}", "compat", warmup=True)
            if res.error != "http_4xx":
                refused = extra
                break
        detail = first.error_detail or f"HTTP {first.status}"
        if refused is None:
            self.client.dropped = base
            self.notes.append(f"compatibility: the server refused the first request ({detail}), and still did "
                              "without every optional element: the request itself is refused (model name, "
                              "prompt length, API path?)")
        else:
            self.dropped = base | refused
            self.client.dropped = self.dropped
            what = " and ".join(OPTIONAL_ELEMENT_TEXT[e] for e in candidates if e in refused)
            flags = " ".join(OPTIONAL_ELEMENTS[e] for e in candidates if e in refused)
            self.notes.append(f"compatibility: the server refuses {what} ({detail}); the run goes on without "
                              f"it ({flags} turns it off up front)")
            self.compat["refused"] = sorted(refused)
        self.compat["dropped"] = sorted(self.dropped)
        self._record_compat()

    def record_context_limit(self, limit: dict[str, Any]) -> dict[str, Any]:
        """Keep and write (meta.json ``probe.context_limit``) where a designed experiment's prompts
        were refused as longer than the server's context (:func:`.context_limit.record`); a
        second limit adds its segments to the first. Only a caller that chose the prompt lengths
        may record one: the rules then leave those refusals out of the failures. Returns the record."""
        if self.context_limit is not None:
            segs = [*self.context_limit["refused_segments"],
                    *(s for s in limit["refused_segments"] if s not in self.context_limit["refused_segments"])]
            limit = {**limit, "refused_segments": segs}
        self.context_limit = limit
        if self.writer is not None:
            self.writer.update_meta(probe={"context_limit": limit})
        return limit

    def _record_ready(self) -> None:
        if self.writer is not None and self.ready is not None:
            self.writer.update_meta(probe={"ready": self.ready.to_meta()})

    def _record_first_contact(self) -> None:
        if self.writer is not None and self.endpoint is not None and self.endpoint.first_contact:
            self.writer.update_meta(probe={"first_contact": self.endpoint.first_contact})

    def _record_compat(self) -> None:
        if self.writer is not None:
            self.writer.update_meta(probe={"compat": self.compat})

    async def _calibrate(self) -> None:
        """Two one-token requests (100 and 300 words, warm-up spans) give the server's tokens
        per word from ``usage.prompt_tokens``, so synthetic prompt lengths match without a
        tokenizer; when the 300 words are refused (a context of a few hundred tokens), 30 and 100
        words do. Without usage in the answers, the 1 word ~ 1 token estimate stays."""
        from collectors.probe.workload import PromptItem

        assert self.client is not None

        async def tokens_of(n_words: int) -> int | None:
            item = PromptItem(prompt=self.workload.calibration_text(n_words), max_tokens=1)
            return (await self.client.request(item, f"calibrate-{n_words}", "calibrate", warmup=True)).usage_input_tokens

        words = [100, 300]
        got = [await tokens_of(n) for n in words]
        if got[0] is not None and got[1] is None:  # the longer one refused: a shorter pair, below it
            words, got = [30, 100], [await tokens_of(30), got[0]]
        if got[0] is not None and got[1] is not None and got[1] > got[0]:
            self.workload.calibrate((got[1] - got[0]) / float(words[1] - words[0]), "from the server's usage.prompt_tokens")
            self.notes.append(f"prompt lengths: {self.workload.calibration}")
        else:
            self.notes.append("prompt lengths: estimated at 1 word ~ 1 token (the server gave no usage to "
                              "calibrate; pass --tokenizer for exact lengths)")
        if self.writer is not None:
            self.writer.update_meta(probe={"prompt_length_method": self.workload.length_method})

    def _client_kwargs(self) -> dict[str, Any]:
        cfg = self.config
        return {"timeout_s": cfg.timeout_s, "api_key": cfg.api_key, "dropped": self.dropped,
                "keep_text": self.tokenizer is not None, "record_prompts": cfg.record_prompts,
                "extra_body": cfg.extra_body, "keepalive_s": cfg.keepalive_s, "retry_reused": cfg.retry_reused}

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        if self.ray_workers is not None:
            workers, self.ray_workers = self.ray_workers, None
            if self.writer is not None:
                self.writer.update_meta(probe={"ray": workers.facts()})
            if self._own_ray_workers:  # else kept for later sessions (ray_workers.kept)
                await asyncio.get_running_loop().run_in_executor(None, workers.close)
        if self.monitor is not None:
            self.health_samples.insert(0, await self.monitor.stop())
            self.monitor = None
        if self.client is not None:
            await self.client.close()
            self.client = None
        along = self.alongside.stop(self.writer)
        if self.sink is not None:
            self._flush_spans()
            self.sink.shutdown()
            self.sink = None
        if self.writer is not None:
            frames = [s.to_frame() for s in self.health_samples if s.ts_s]
            if frames:
                import pandas as pd

                self.writer.append_series("client", pd.concat(frames, ignore_index=True))
            self.writer.update_meta(alongside=along, client_health=self.client_health())
            if self._own_writer:
                self.writer.close()

    def _write_meta_start(self) -> None:
        if self.writer is None or self.endpoint is None:
            return
        cfg = self.config
        self.writer.update_meta(
            # a caller's capture (ttft diagnose) keeps its own kind; the demo's queue writer has no meta
            kind=(getattr(self.writer, "meta", None) or {}).get("kind") or "probe",
            probe={
                "url": self.endpoint.url,
                "api": self.endpoint.api,
                "api_detected": self.endpoint.detected,
                "model": self.endpoint.model,
                "load": cfg.load.describe(),
                "workload": cfg.workload.describe(),
                "prompt_length_method": self.workload.length_method,
                "workers": cfg.workers,
                "ray": {"address": cfg.ray_address} if cfg.ray_address else None,
                "cpus": list(available_cpus() or ()) if cfg.cpus else None,  # the mask in force
                "event_loop": eventloop.loop_name(),
                "timeout_s": cfg.timeout_s,
                "slo": cfg.slo,
                "record_prompts": cfg.record_prompts,
                "started_unix_s": time.time(),
                "notes": self.notes,
            },
            ttft_boundary={"client": stages.CLIENT_BOUNDARY.to_dict(),
                           "client_note": "TTFT ends at the first SSE event with non-empty content: role-only, "
                           "empty and usage-only chunks do not count; slot wait is reported apart"},
            metric_definitions=DEFINITIONS,
        )

    def client_health(self) -> dict[str, Any]:
        measured = [r for r in self.results if not r.warmup and r.error is None and r.first_content_ns]
        out = health_mod.summarize(self.health_samples if len(self.health_samples) else [],
                                   (r.conn_wait_s for r in self.results),
                                   ([r.start_ns / 1e9 for r in measured], [r.first_content_ns / 1e9 for r in measured]))
        out["connection_retries"] = health_mod.connection_retries((r.conn_retries for r in self.results),
                                                                  (r.conn_retry_lost_s for r in self.results))
        out["client_cpu"] = health_mod.client_cpu(
            self.health_samples, requests=len(self.results),
            chunks=sum(len(r.token_times_ns) for r in self.results) or None,
            server_local=health_mod.server_is_local(self.endpoint.base_url if self.endpoint else None),
            pinned=self.config.cpus)
        return out

    # --- phases -----------------------------------------------------------------------------

    def _on_result(self, phase_label: str, total: int | None) -> Callable[[RequestResult], None]:
        progress = self.config.progress

        def on_result(res: RequestResult) -> None:
            self._done_in_phase += 1
            self._since_flush += 1
            if progress is not None:
                progress(self._done_in_phase, total, phase_label)
            if self._since_flush >= FLUSH_EVERY_REQUESTS:
                self._flush_spans()

        return on_result

    def flush_spans(self) -> None:
        """Write the spans of the requests finished so far (a live view's periodic flush; loop thread)."""
        self._flush_spans()

    def _flush_spans(self) -> None:
        self._since_flush = 0
        if self.sink is None:
            return
        if self.writer is None:  # no capture: drop the spans without encoding them
            self.sink.force_flush()
            if self.sink.memory is not None:
                self.sink.memory.clear()
            return
        lines = drain_span_lines(self.sink)
        if self.writer is not None and lines:
            self.writer.append_span_lines(lines)

    async def phase(self, load: LoadSpec, workload: Workload | None = None, segment: str | None = None) -> PhaseOutcome:
        """Run one load phase and keep its results; returns the outcome."""
        assert self.client is not None and self.endpoint is not None, "use 'async with ProbeSession(...)'"
        workload = workload or self.workload
        self._done_in_phase = 0
        phase_label = segment or "probe"
        if self.config.workers > 1 or self.config.ray_address is not None:
            loop = asyncio.get_running_loop()
            if self.config.ray_address is not None:
                outcome = await self._ray_phase(load, workload, segment, phase_label)
            else:
                outcome = await loop.run_in_executor(
                    None, run_phase_in_workers, self.config.workers, self.endpoint, self._client_kwargs(), workload,
                    load, segment, True, self.config.cpus, self.config.otlp_endpoint)
            if self.writer is not None and outcome.span_lines:
                self.writer.append_span_lines(outcome.span_lines)
            outcome.span_lines = []
            self.health_samples.extend(outcome.health)
            self.notes.extend(outcome.notes)
            if self.config.progress is not None:
                self.config.progress(len(outcome.measured), len(outcome.measured), phase_label)
        else:
            cap = load.concurrency
            if cap > self.client.concurrency:  # a bigger point than the pool was sized for
                await self.client.close()
                self.client.concurrency = cap
                await self.client.open()
            outcome = await run_phase(self.client, workload, load, segment,
                                      self._on_result(phase_label, load.bounded_requests), health=self.monitor)
            self._flush_spans()
        self.results.extend(outcome.results)
        self.phase_spans.append((outcome.start_ns, outcome.end_ns))
        self.alongside.parse_pending()  # nothing in flight now: the scrapes fetched meanwhile are parsed
        return outcome

    async def _ray_phase(self, load: LoadSpec, workload: Workload, segment: str | None, phase_label: str) -> PhaseOutcome:
        """One phase on the session's Ray actors (started here the first time); meta.json
        ``probe.ray`` updated after it. Progress is passed to the loop's thread as results come in."""
        from collectors.probe.ray_workers import session_workers

        loop = asyncio.get_running_loop()
        if self.ray_workers is None:
            assert self.config.ray_address is not None
            self.ray_workers, self._own_ray_workers = await loop.run_in_executor(
                None, session_workers, self.config.ray_address, self.config.workers)
        progress = self.config.progress
        on_progress = None if progress is None else (
            lambda done, total: loop.call_soon_threadsafe(progress, done, total, phase_label))
        outcome = await loop.run_in_executor(
            None, self.ray_workers.run_phase, self.endpoint, self._client_kwargs(), workload, load, segment, True,
            self.config.otlp_endpoint, on_progress)
        if self.writer is not None:
            self.writer.update_meta(probe={"ray": self.ray_workers.facts()})
        return outcome

    def _over_context(self) -> list[str]:
        return list(self.context_limit["refused_segments"]) if self.context_limit else []

    def metrics(self, outcome: PhaseOutcome) -> dict[str, Any]:
        """One phase's metrics (refusals at a recorded context limit counted apart)."""
        return compute_metrics(outcome.results, outcome.duration_s, self.config.slo, self._over_context())

    def overall_metrics(self) -> dict[str, Any]:
        dur = sum(max(0, e - s) for s, e in self.phase_spans) / 1e9
        return compute_metrics(self.results, dur, self.config.slo, self._over_context())

    def record_summary(self, overall: dict[str, Any], sweep: dict[str, Any] | None) -> None:
        """meta.json: token-count source, output-length honouring, results per segment."""
        if self.writer is None:
            return
        tok = overall["tokens"]
        sources = set(tok["output_source"])
        self.writer.update_meta(
            token_counts={"source": sources.pop() if len(sources) == 1 else ("mixed" if sources else None),
                          "by_source": tok["output_source"],
                          "tokenizer": self.tokenizer.path if self.tokenizer else None,
                          "discrepancy": tok.get("discrepancy")},
            output_lengths={"requested": str(self.config.workload.output_tokens),
                            "exact_requested": "exact_output" not in self.dropped,
                            "how": "max_tokens + min_tokens + ignore_eos" if "exact_output" not in self.dropped
                            else "max_tokens only",
                            **overall["output_lengths"]},
            probe_results={"overall": _slim(overall), "segments": {s: _slim(m) for s, m in self.segments}},
            sweep=sweep,
        )
        self.writer.update_meta(probe={"ended_unix_s": time.time(), "notes": self.notes})


def _slim(m: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in m.items() if k not in ("definitions",)}


__all__ = ["ProbeSession"]
