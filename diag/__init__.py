"""ttft-diag's core. Its ground floor (stages, capture, otlp_json, tables, slo, units,
external_spans) imports nothing above it; ``diag.engine`` is the bundled engine (floor 2);
``diag.analysis``, ``diag.report`` and ``diag.scenarios`` are upper rooms; ``diag.cli`` and
``diag.commands`` are the roof. ``tests/test_layering.py`` holds the floor table."""
