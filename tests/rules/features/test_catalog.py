"""rules.features.catalog: every feature name once, with its producing theme and a unit from the closed set."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from support.featcap import make_tables

from diag.ground import stages
from diag.ground.capture import load_capture
from diag.ground.tables import build_tables
from diag.ground.units import Unit
from rules.features import THEMES, compute_features, run_themes, theme_name
from rules.features.catalog import CATALOG
from rules.features.stage_shares import SHARE_NAMES

ROOT = Path(__file__).resolve().parents[3]
SAMPLES = ROOT / "samples"
#: a few real captures: joined client+server, client only, series only (an external engine's /metrics)
CAPTURES = [("queue", ("client", "server-0")), ("interference", ("client",)), ("kv_cache", ("client", "server-0"))]


def _sample_sets() -> list[list[Path]]:
    sets = [[SAMPLES / name / part for part in parts] for name, parts in CAPTURES]
    sets += [[p] for p in sorted(SAMPLES.glob("external/*/capture"))[:3]]
    return [s for s in sets if all(p.exists() for p in s)]


@pytest.fixture(scope="module")
def produced() -> dict[str, tuple[str, str]]:
    """feature name -> (unit, producing theme) over a few real captures, with and without an SLO."""
    out: dict[str, tuple[str, str]] = {}
    sets = _sample_sets()
    assert len(sets) >= 4
    for paths in sets:
        tables = build_tables([load_capture(p) for p in paths])
        for slo in (None, {"ttft_p99": 0.5, "itl_p99": 0.05}):
            ctx = run_themes(tables, slo=slo)
            for name, f in ctx.features.items.items():
                out[name] = (f.unit, ctx.produced_by[name])
    return out


def test_every_produced_feature_is_catalogued_with_its_unit_and_theme(produced: dict[str, tuple[str, str]]) -> None:
    for name, (unit, theme) in produced.items():
        assert name in CATALOG, name
        assert unit == CATALOG[name].unit, name
        assert theme == CATALOG[name].theme, name


def test_every_catalogue_entry_is_emitted_by_its_producer(produced: dict[str, tuple[str, str]]) -> None:
    """Present or explicitly unavailable: a catalogue name no theme writes is a stale entry."""
    assert set(CATALOG) - set(produced) == set()


def test_units_are_from_the_closed_set_and_themes_exist() -> None:
    closed = {u.value for u in Unit}
    themes = {theme_name(t) for t in THEMES}
    for spec in CATALOG.values():
        assert spec.unit in closed, spec
        assert spec.theme in themes, spec


def test_empty_tables_emit_only_catalogued_names() -> None:
    feats = compute_features(make_tables())
    assert len(feats) > 50
    for name in feats:
        assert name in CATALOG, name


def test_stage_share_names_cover_every_decomposition_stage() -> None:
    assert set(SHARE_NAMES) == set(stages.DECOMPOSITION_STAGES)
    for median, tail in SHARE_NAMES.values():
        assert median in CATALOG and tail in CATALOG


def test_no_feature_name_is_built_by_an_f_string() -> None:
    """A grep for a feature name finds its producer: ``add``/``na`` take spelt-out names only."""
    for path in sorted((ROOT / "rules" / "features").glob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in ("add", "na") \
                    and isinstance(node.func.value, ast.Name) and node.func.value.id == "ctx" and node.args:
                assert not isinstance(node.args[0], ast.JoinedStr), f"{path.name}:{node.lineno}"
