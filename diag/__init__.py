"""ttft-diag's ``diag`` package, one folder per floor: ``diag.ground`` (schema, captures, tables,
units, what external engines name; imports nothing above it), ``diag.bundled_engine`` (the
bundled torch reference engine, floor 2 beside ``collectors`` and ``rules``),
``diag.analysis`` (the front door, fleet, ``ttft diagnose``'s experiment, scenarios and
reports; floor 3) and ``diag.cli`` (the roof). ``tests/test_layering.py`` holds the floor table
and ``docs/architecture.md`` describes it."""
