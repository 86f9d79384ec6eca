"""Regenerate ``samples/<scenario>/``: one small capture set per scenario (client + servers).

Spans are stored gzip-compressed (``spans.otlp.jsonl.gz``; the loader reads them as they are)
so each sample stays a few hundred KB. ``ttft analyze samples/<scenario>`` names its category.
"""

from __future__ import annotations

import gzip
import shutil
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

from diag.ground.capture import SPANS_FILE
from diag.analysis.scenarios.calibrate import Calibration
from diag.analysis.scenarios.catalog import Scenario
from diag.analysis.scenarios.matrix import MODES, MatrixRow, diagnose_run
from diag.analysis.scenarios.runner import run_scenario


def pack_capture(src: Path, dst: Path) -> None:
    """Copy a capture, gzipping its spans file."""
    shutil.copytree(src, dst)
    spans = dst / SPANS_FILE
    if spans.exists():
        with open(spans, "rb") as fin, gzip.open(str(spans) + ".gz", "wb", compresslevel=9) as fout:
            shutil.copyfileobj(fin, fout)
        spans.unlink()


def make_samples(scenarios: Sequence[Scenario], out_root: str | Path, cal: Calibration,
                 log: Callable[[str], None] | None = None) -> list[MatrixRow]:
    """Run each scenario, check its verdicts, and write ``out_root/<name>/``."""
    out_root = Path(out_root)
    rows = []
    with tempfile.TemporaryDirectory(prefix="ttft-samples-") as tmp:
        for sc in scenarios:
            if log:
                log(f"sample {sc.name} ...")
            run = run_scenario(sc, Path(tmp) / sc.name, cal, log=log)
            row = MatrixRow(sc.name, sc.category, {m: diagnose_run(run, m) for m in MODES}, run.wall_s,
                            {"client-only": sc.client_only_also})
            rows.append(row)
            dst = out_root / sc.name
            if dst.exists():
                shutil.rmtree(dst)
            dst.mkdir(parents=True)
            for cap in run.all_captures:
                pack_capture(cap, dst / cap.name)
            for extra in run.out_dir.glob("prompts-*.jsonl"):
                shutil.copy(extra, dst / extra.name)
    return rows
