"""The evaluation of the engines' /metrics tables: scrape snapshots and the shared arithmetic
(:mod:`.core`) and each source type over a scrape pair and in PromQL (:mod:`.evaluation`).

The tables themselves are plain data on the ground floor (each engine's ``METRICS`` in
:mod:`diag.ground.external`, built from :mod:`diag.ground.metric_sources`); the registry and
detection live in :mod:`collectors.prometheus_adapters` (the front door).
"""
