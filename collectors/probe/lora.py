"""LoRA adapters for the probe (``--lora A,B,...``): what a server's adapter slots cost, seen from the client.

A server that serves LoRA adapters batches requests of the adapters it holds in its slots
(vLLM: ``--max-loras``); a request for another adapter waits until a slot frees, and its
adapter may have to be loaded first (vLLM's ``--max-cpu-loras`` cache, else from disk). Each
request of the design asks for one adapter, drawn at random from the list, as its ``model``.
At its send the client notes the adapters of the requests then in flight (:class:`LoraRoles`):
``alone`` (nothing in flight), ``joins`` (its own adapter is among them: it is batched with
theirs) or ``other`` (only other adapters: with too few slots it waits for their turn). Under
the same load, ``other`` requests slower than ``joins`` ones are waits for a slot or a load.
(The adapters *running*, those of requests in flight that had a first token, predict worse:
on real vLLM with one slot and three adapters, other/joins read 6x by the adapters in flight
and under 1x by those running, whose turn may end before the new request's comes.)

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
    """The requests in flight by key (a request's own key, from :meth:`on_send` to :meth:`on_done`)
    and their adapters, and each new request's role against them (one loop)."""

    def __init__(self) -> None:
        self._inflight: dict[object, str] = {}

    def on_send(self, key: object, adapter: str) -> str:
        live = set(self._inflight.values())
        self._inflight[key] = adapter
        if not live:
            return ROLE_ALONE
        return ROLE_JOINS if adapter in live else ROLE_OTHER

    def on_done(self, key: object) -> None:
        self._inflight.pop(key, None)
