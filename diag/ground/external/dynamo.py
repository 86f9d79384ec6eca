"""NVIDIA Dynamo (its front end before the workers): what to check next in its terms when a rule
fires.

Pure data; its ``/metrics`` names are in :mod:`collectors.adapters.dynamo` (``docs/engines.md``
has the table).
"""

from __future__ import annotations

#: what to check next in Dynamo's terms, by rule id (read through :func:`diag.ground.external.next_checks`)
NEXT_CHECKS: dict[str, str] = {
    "frontend": "Dynamo: frontend replicas against the workers",
}
