"""The pieces of ``samples/external/make_external_samples.py``: the simulation, shared exposition and
OTLP helpers, and one renderer per engine (each cites the engine source its names and meanings
were read from; the table is docs/engines.md)."""
