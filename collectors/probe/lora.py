"""LoRA adapters for the probe (``--lora A,B,...``): what a server's adapter slots cost, seen from the client.

A server that serves LoRA adapters batches requests of the adapters it holds in its slots
(vLLM: ``--max-loras``); a request for another adapter waits until a slot frees, and its
adapter may have to be loaded first (vLLM's ``--max-cpu-loras`` cache, else from disk). Each
request of the design asks for one adapter, drawn at random from the list, as its ``model``.
At its send the client notes the adapters then running, i.e. of requests in flight that have
had their first token (:class:`LoraRoles`): ``alone`` (nothing in flight), ``joins`` (its own
adapter is running: it can share their batch), ``other`` (only other adapters are running: with
too few slots it waits for them) or ``pending`` (requests in flight, none running yet: where it
stands is unknown). Under the same load, ``other`` requests slower than ``joins`` ones are waits
for a slot or a load.

Threading: a :class:`LoraRoles` belongs to one client on one event loop.
"""

from __future__ import annotations

ROLE_ALONE = "alone"
ROLE_JOINS = "joins"
ROLE_OTHER = "other"
ROLE_PENDING = "pending"


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
    """The requests in flight by key (their adapter, and whether they have had their first token),
    and each new request's role against the adapters running (one loop). A request is in flight
    from :meth:`on_send` to :meth:`on_done`, running from :meth:`on_first_token`."""

    def __init__(self) -> None:
        self._inflight: dict[object, list] = {}  # key -> [adapter, running]

    def on_send(self, key: object, adapter: str) -> str:
        running = {a for a, r in self._inflight.values() if r}
        role = ROLE_ALONE if not self._inflight else (
            ROLE_PENDING if not running else ROLE_JOINS if adapter in running else ROLE_OTHER)
        self._inflight[key] = [adapter, False]
        return role

    def on_first_token(self, key: object) -> None:
        if key in self._inflight:
            self._inflight[key][1] = True

    def on_done(self, key: object) -> None:
        self._inflight.pop(key, None)
