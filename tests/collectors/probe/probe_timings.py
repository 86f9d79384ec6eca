"""Timings of the test SSE server (shared by conftest.py and the tests; not a conftest import)."""

FIRST_CONTENT_DELAY_S = 0.08  # role-only chunk at once, first content after this
SLOW_S = 0.1
