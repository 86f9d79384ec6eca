"""Per-engine /metrics tables, one module per engine, and the evaluation of their sources.

The source types are plain data in :mod:`diag.ground.metric_sources`; :mod:`.evaluation` evaluates
them over scrape pairs and in PromQL, on :mod:`.core`'s snapshots and arithmetic. The registry and
detection live in :mod:`collectors.prometheus_adapters` (the front door); each engine module cites
the file and commit its names were read from.
"""
