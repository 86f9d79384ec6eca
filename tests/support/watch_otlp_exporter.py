"""An engine's OTLP exporter on its own, run as a process by the live-fault tests.

``python watch_otlp_exporter.py URL`` records an engine step span every 50 ms with the
project's span helpers and exports them to URL (OTLP/HTTP) every 0.2 s, until it is killed.
"""

from __future__ import annotations

import sys
import time

from collectors.spans import setup_tracing
from diag.ground import stages


def main() -> None:
    sink = setup_tracing(service_name="watch-test-engine", otlp_endpoint=sys.argv[1], export_interval_s=0.2)
    print("exporting", flush=True)
    i = 0
    while True:
        start = time.time_ns()
        time.sleep(0.01)
        sink.record_step(start, time.time_ns(), {stages.ATTR_STEP_INDEX: i, stages.ATTR_STEP_RUNNING: 1,
                                                 stages.ATTR_STEP_WAITING: 0, stages.ATTR_STEP_DECODE_SEQS: 1})
        i += 1
        time.sleep(0.04)


if __name__ == "__main__":
    main()
