"""Everything that observes (floor 2 of the house: imports the ground floor of ``diag`` only).

Time-series collectors implement one protocol, :class:`collectors.base.SeriesCollector`
(NVML, the /metrics scraper, py-spy); :mod:`collectors.live` runs a live session's collectors
into one capture; :mod:`collectors.spans` holds the OpenTelemetry span helpers, the probe
lives in :mod:`collectors.probe`, the OTLP receiver in :mod:`collectors.otlp_receiver`.
"""
