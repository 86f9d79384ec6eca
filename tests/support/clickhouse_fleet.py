"""A fleet of simulated replicas, each naming itself as a real one would
(``OTEL_RESOURCE_ATTRIBUTES=service.instance.id=NAME``), for the ClickHouse trace-store tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from support.simcap import MS, Client, Engine, Phase, poisson, simulate

#: name -> (engine, phases): two healthy replicas and one whose step loop stalls (engine overhead)
FLEET = {
    "replica-a": (Engine(), [Phase("steady", 40, [64, 64, 80], 16, conc=None, arrivals_s=poisson(40, 20))]),
    "replica-b": (Engine(stall_s=30 * MS), [Phase("concurrency=4", 60, 64, 16, conc=4)]),
    "replica-c": (Engine(), [Phase("steady", 40, [64, 80], 16, conc=None, arrivals_s=poisson(40, 20, seed=3))]),
}
SLOW = "replica-b"


def simulate_fleet(base: Path, fleet: dict[str, tuple[Engine, list[Phase]]] = FLEET) -> dict[str, dict[str, Path]]:
    """Each replica's client and server captures under ``base/NAME``, its spans' resource carrying
    ``service.instance.id=NAME``."""
    out = {}
    for i, (name, (engine, phases)) in enumerate(fleet.items()):
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv("OTEL_RESOURCE_ATTRIBUTES", f"service.instance.id={name}")
            out[name] = simulate(base / name, engine, phases, Client(), seed=i + 1)
    return out
