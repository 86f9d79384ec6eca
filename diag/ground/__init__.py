"""The ground floor: span and series names (``stages``), captures on disk (``capture*``), OTLP
JSON, the tables the rules read (``tables``, ``request_table``), SLOs, units and the one value
formatter, exit codes, what external engines name (``external/`` and ``external_*``) and the
ClickHouse trace store. Imports nothing above itself; no threads of its own."""
