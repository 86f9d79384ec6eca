"""Timings of the test SSE server (shared by conftest.py and the tests; not a conftest import)."""

FIRST_CONTENT_DELAY_S = 0.08  # role-only chunk at once, first content after this
SLOW_S = 0.1
CTX_BASE_S = 0.01  # ctx-N modes: first content after this plus CTX_S_PER_TOKEN per prompt token
CTX_S_PER_TOKEN = 50e-6
