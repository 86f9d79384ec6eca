"""Per-engine /metrics tables, one module per engine, and the source types they are made of.

The registry, detection and evaluation live in :mod:`collectors.prometheus_adapters` (the
front door); each engine module cites the file and commit its names were read from.
"""
