"""The feature result types: one measured quantity (:class:`Feature`) and the set of them (:class:`Features`).

Plain data, no computation; not thread-safe for concurrent writers (a computation fills one
``Features`` on one thread, readers may share it afterwards).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from diag.ground.units import json_safe


@dataclass
class Feature:
    """One measured quantity. ``value`` is a float, a dict (a small table) or None.

    ``unit`` is one of the closed set of units (see :mod:`rules.features.catalog`).
    ``available`` is False when it cannot be computed; ``reason`` then says why (one line).
    ``source`` names where it came from when there are several ways (e.g. "nvml", "engine_steps").
    """

    name: str
    value: float | dict[str, Any] | None
    unit: str
    available: bool
    reason: str | None = None
    source: str | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"value": json_safe(self.value), "unit": self.unit, "available": self.available}
        if self.reason:
            out["reason"] = self.reason
        if self.source:
            out["source"] = self.source
        return out


@dataclass
class Features:
    """A mapping name -> :class:`Feature` with convenience accessors."""

    items: dict[str, Feature] = field(default_factory=dict)

    def add(self, feature: Feature) -> None:
        self.items[feature.name] = feature

    def get(self, name: str) -> Feature:
        """The feature, or an unavailable placeholder saying it was not computed."""
        f = self.items.get(name)
        if f is None:
            return Feature(name, None, "", False, "not computed for this capture")
        return f

    def value(self, name: str, default: Any = None) -> Any:
        f = self.items.get(name)
        if f is None or not f.available or f.value is None:
            return default
        return f.value

    def available(self, name: str) -> bool:
        f = self.items.get(name)
        return bool(f is not None and f.available and f.value is not None)

    def __contains__(self, name: object) -> bool:
        return name in self.items

    def __getitem__(self, name: str) -> Feature:
        return self.items[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self.items)

    def __len__(self) -> int:
        return len(self.items)

    def to_dict(self) -> dict[str, Any]:
        return {k: f.to_dict() for k, f in self.items.items()}
