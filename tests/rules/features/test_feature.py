"""rules.features.feature: Feature and Features, the result types."""

from __future__ import annotations

from rules.features import Feature, Features


def test_feature_accessors() -> None:
    f = Features()
    f.add(Feature("a", 1.5, "s", True))
    f.add(Feature("b", None, "s", False, "no data here"))
    assert f.value("a") == 1.5 and f.value("b", 7) == 7 and f.value("zzz") is None
    assert f.available("a") and not f.available("b")
    assert f.get("zzz").reason == "not computed for this capture"
    d = f.to_dict()
    assert d["b"] == {"value": None, "unit": "s", "available": False, "reason": "no data here"}
