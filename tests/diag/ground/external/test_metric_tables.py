"""Each engine's ``/metrics`` table (``METRICS`` of the modules of diag.ground.external, and
trtllm's ``TRITON_METRICS``): it cites where its names were read and says what its numbers mean."""

from __future__ import annotations

from importlib import import_module

import pytest

from diag.ground import stages as S
from diag.ground.external import ENGINES, sglang, trtllm, vllm
from diag.ground.metric_sources import EngineAdapter

#: every table, by the module that holds it (transformers serve has no /metrics)
TABLES: dict[str, EngineAdapter] = {
    name: import_module(f"diag.ground.external.{name}").METRICS for name in ENGINES if name != "transformers"
}
TABLES["triton"] = trtllm.TRITON_METRICS


@pytest.mark.parametrize("name", sorted(TABLES))
def test_every_table_is_its_engines_and_cites_its_source(name):
    table = TABLES[name]
    assert table.engine == name and table.maps
    assert table.source, name
    if name != "bundled":
        assert "@" in table.source  # a commit, not just a file
    assert all(m.series and m.sources for m in table.maps)


def test_vllm_note_states_the_boundary_and_the_windowed_means():
    note = vllm.METRICS.note
    assert "after" in note and "tokeniz" in note and "detokenize" in note
    assert "observed at finish" in note and "first token" in note
    assert vllm.METRICS.source == vllm.SOURCE and "@" in vllm.SOURCE


def test_the_bundled_engine_reads_vllms_names_under_its_prefix():
    bundled = TABLES["bundled"]
    assert [m.series for m in bundled.maps] == [m.series for m in vllm.METRICS.maps]
    assert all(n.startswith("ttft_engine:") for n in bundled.metric_names())


def test_sglang_prefill_note_is_the_whole_prefill():
    prefill = next(m for m in sglang.METRICS.maps if m.series == S.SERIES_PREFILL_TIME_S)
    assert "all chunks" in prefill.note and "last chunk" not in prefill.note
    assert "observability/metrics_collector.py" in sglang.METRICS.source
