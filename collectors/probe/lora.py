"""LoRA adapters for the probe (``--lora A,B,...``): what a server's adapter slots cost, seen from the client.

A server that serves LoRA adapters batches requests of the adapters it holds in its slots
(vLLM: ``--max-loras``); a request for another adapter waits until a slot frees, and its
adapter may have to be loaded first (vLLM's ``--max-cpu-loras`` cache, else from disk). Each
request of the design asks for one adapter, drawn at random from the list, as its ``model``.
At its send the client notes the adapters then in flight (:class:`LoraRoles`): ``alone``
(none in flight), ``joins`` (its own adapter is among them: it can share their batch) or
``other`` (only other adapters: with too few slots it waits for them). Under the same load,
``other`` requests slower than ``joins`` ones are waits for a slot or a load.

Threading: a :class:`LoraRoles` belongs to one client on one event loop.
"""

from __future__ import annotations

ROLE_ALONE = "alone"
ROLE_JOINS = "joins"
ROLE_OTHER = "other"


class LoraSpecError(ValueError):
    """A ``--lora`` value that cannot be used (one line)."""


def parse_lora(text: str) -> tuple[str, ...]:
    """``A,B,...``: adapter names as the server serves them (its ``model`` names), each once."""
    names = tuple(n.strip() for n in text.split(","))
    if not names or any(not n or any(c.isspace() for c in n) for n in names):
        raise LoraSpecError(f"--lora {text!r}: expected adapter names separated by commas (no spaces)")
    if len(set(names)) != len(names):
        raise LoraSpecError(f"--lora {text!r}: an adapter is named twice")
    return names


class LoraRoles:
    """The adapters of the requests in flight, and each new request's role against them (one loop)."""

    def __init__(self) -> None:
        self._inflight: dict[str, int] = {}

    def on_send(self, adapter: str) -> str:
        live = {a for a, n in self._inflight.items() if n > 0}
        self._inflight[adapter] = self._inflight.get(adapter, 0) + 1
        if not live:
            return ROLE_ALONE
        return ROLE_JOINS if adapter in live else ROLE_OTHER

    def on_done(self, adapter: str) -> None:
        self._inflight[adapter] = max(0, self._inflight.get(adapter, 0) - 1)
