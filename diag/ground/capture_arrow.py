"""Fast path for reading ``spans.otlp.jsonl``: pyarrow's JSON reader plus vectorised flattening.

Parsing happens in Arrow's C++ reader; spans, their resources and their attributes are
flattened with list/struct kernels, so no Python code runs per span. Any surprise (a corrupt
line, a type that changes between lines, an unexpected shape) makes :func:`read_spans_arrow`
return ``None`` and the caller falls back to the line-by-line reader, which reports exactly
which line is bad. Output columns match :mod:`diag.ground.capture`'s span table.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pj

_BLOCK_BYTES = 1 << 24  # a line (one export request) must fit in one block
_TYPED_FIELDS = ("intValue", "doubleValue", "boolValue", "stringValue", "arrayValue", "kvlistValue", "bytesValue")


def _field(arr: pa.Array, name: str) -> pa.Array | None:
    """A struct child that respects the parent's nulls; None when the field is absent."""
    if not pa.types.is_struct(arr.type) or arr.type.get_field_index(name) < 0:
        return None
    return pc.struct_field(arr, name)


def _list_children(arr: pa.Array | None) -> tuple[pa.Array, np.ndarray] | None:
    """Flatten a list array: (children, parent index of each child)."""
    if arr is None or not pa.types.is_list(arr.type):
        return None
    return pc.list_flatten(arr), pc.list_parent_indices(arr).to_numpy()


def _strings(arr: pa.Array | None, n: int) -> pa.Array:
    if arr is None:
        return pa.array([""] * n, type=pa.string())
    if not pa.types.is_string(arr.type):
        raise TypeError("expected strings")
    return pc.fill_null(arr, "")


def _ns(arr: pa.Array | None, n: int) -> np.ndarray:
    if arr is None:
        return np.zeros(n, dtype="int64")
    if pa.types.is_string(arr.type) or pa.types.is_integer(arr.type):
        return pc.fill_null(pc.cast(arr, pa.int64()), 0).to_numpy()
    raise TypeError("timestamps must be integer strings")


def _clean(value: Any) -> Any:
    """to_pylist() of an AnyValue struct has every field, most None: keep the set one."""
    if not isinstance(value, dict):
        return None
    for key in _TYPED_FIELDS:
        v = value.get(key)
        if v is None:
            continue
        if key == "intValue":
            return int(v)
        if key == "arrayValue":
            return [_clean(x) for x in (v.get("values") or [])]
        if key == "kvlistValue":
            return {kv["key"]: _clean(kv.get("value")) for kv in (v.get("values") or [])}
        return v
    return None


def _typed_values(values: pa.Array, n: int, rows: np.ndarray) -> np.ndarray:
    """Scatter AnyValue structs (one per row index in ``rows``) into an object column."""
    out = np.full(n, None, dtype=object)
    for key in reversed(_TYPED_FIELDS):  # the first typed field wins: fill it last
        sub = _field(values, key)
        if sub is None or sub.null_count == len(sub):
            continue
        valid = sub.is_valid().to_numpy(zero_copy_only=False)
        if not valid.any():
            continue
        idx = rows[valid]
        sub = sub.filter(pa.array(valid))
        if key == "intValue":
            out[idx] = pc.cast(sub, pa.int64()).to_numpy(zero_copy_only=False).astype(object)
        elif key == "arrayValue":
            vals = _field(sub, "values")
            flat = _list_children(vals)
            if flat is None:
                continue
            children, parents = flat
            ints = _field(children, "intValue")
            if ints is not None and ints.null_count == 0 and len(ints) == len(children):
                nums = pc.cast(ints, pa.int64()).to_numpy()
                offsets = vals.offsets.to_numpy()
                offsets = offsets - offsets[0]
                out[idx] = [nums[a:b] for a, b in zip(offsets[:-1], offsets[1:])]
            else:
                out[idx] = [_clean({"arrayValue": v}) for v in sub.to_pylist()]
        elif key == "kvlistValue":
            out[idx] = [_clean({"kvlistValue": v}) for v in sub.to_pylist()]
        else:
            out[idx] = sub.to_numpy(zero_copy_only=False)
    return out


def read_spans_arrow(path: Path, known: frozenset[str], columns: tuple[str, ...]) -> pd.DataFrame | None:
    """Read a spans file into the span table, or None when the fast path cannot be trusted."""
    try:
        return _read(path, known, columns)
    except (pa.ArrowException, TypeError, ValueError, KeyError, IndexError, OverflowError):
        return None


def _looks_like_export_lines(path: Path) -> bool:
    """Every line is a complete ``{"resourceSpans":...}`` object (cheap: lines are large).

    Arrow's JSON reader is only handed files that pass: it is not hardened against
    top-level non-objects (it can crash on a bare ``null`` line).
    """
    from diag.ground.capture_spans import open_spans

    with open_spans(path) as fh:
        for line in fh:
            body = line.rstrip(b"\r\n")
            if not body:
                return False
            if not body.startswith(b'{"resourceSpans":[') or not body.endswith(b"}") or len(body) >= _BLOCK_BYTES:
                return False
    return True


def _read(path: Path, known: frozenset[str], columns: tuple[str, ...]) -> pd.DataFrame | None:
    if not _looks_like_export_lines(path):
        return None

    def source() -> Any:
        return pa.input_stream(str(path), compression="gzip") if path.suffix == ".gz" else str(path)

    read_options = pj.ReadOptions(block_size=_BLOCK_BYTES, use_threads=True)
    parse_options = pj.ParseOptions(newlines_in_values=False)
    # Streaming block by block bounds memory to one block's nested table at a time. The schema
    # comes from the first block; a later block with new fields fails the stream, and the whole
    # file is then read at once (one schema inferred over everything).
    try:
        parts = []
        for batch in pj.open_json(source(), read_options=read_options, parse_options=parse_options):
            part = _frame(pa.Table.from_batches([batch]), known, path)
            if part is None:
                return None
            parts.append(part)
    except pa.ArrowInvalid:
        part = _frame(pj.read_json(source(), read_options=read_options, parse_options=parse_options), known, path)
        if part is None:
            return None
        parts = [part]
    if not parts:
        return None
    if len(parts) == 1:
        df = parts[0]
    else:
        from pandas.api.types import union_categoricals

        cats = {c: union_categoricals([p[c] for p in parts]) for c in ("name", "service")}
        partial = {c for p in parts for c in p.columns} - set.intersection(*(set(p.columns) for p in parts))
        df = pd.concat([p.drop(columns=["name", "service"]) for p in parts], ignore_index=True)
        for c, values in cats.items():
            df[c] = values
        for col in partial:  # concat fills a column absent from some blocks with NaN: keep None
            if df[col].dtype == object:
                df[col] = df[col].where(df[col].notna(), None)
        parts.clear()
    df["source_file"] = pd.Categorical.from_codes(np.zeros(len(df), dtype="int8"), categories=[str(path)])
    return df


def _frame(table: pa.Table, known: frozenset[str], path: Path) -> pd.DataFrame | None:
    """Flatten one table of export requests (any number of lines) into span rows."""
    if "resourceSpans" not in table.column_names or table.num_columns != 1:
        return None
    rs_list = table.column("resourceSpans").combine_chunks()
    if rs_list.null_count:
        return None  # a line without resourceSpans: let the careful reader name it
    rs_flat = _list_children(rs_list)
    if rs_flat is None:
        return None
    rs = rs_flat[0]
    services = np.full(len(rs), "", dtype=object)
    resource_attrs = _list_children(_field(_field(rs, "resource"), "attributes") if _field(rs, "resource") is not None else None)
    if resource_attrs is not None:
        kvs, parent = resource_attrs
        is_name = pc.equal(_field(kvs, "key"), "service.name").to_numpy(zero_copy_only=False)
        is_name = np.asarray(is_name, dtype=bool) if is_name.dtype != bool else is_name
        name_vals = _field(_field(kvs, "value"), "stringValue")
        if name_vals is not None and is_name.any():
            services[parent[is_name]] = name_vals.filter(pa.array(is_name)).to_numpy(zero_copy_only=False)
    ss_flat = _list_children(_field(rs, "scopeSpans"))
    if ss_flat is None:
        return None
    ss, ss_parent = ss_flat
    sp_flat = _list_children(_field(ss, "spans"))
    if sp_flat is None:
        return None
    spans, sp_parent = sp_flat
    n = len(spans)
    base = pa.table(
        {
            "trace_id": _strings(_field(spans, "traceId"), n),
            "span_id": _strings(_field(spans, "spanId"), n),
            "parent_span_id": _strings(_field(spans, "parentSpanId"), n),
            "name": _strings(_field(spans, "name"), n),
        }
    )
    df = base.to_pandas(types_mapper={pa.string(): pd.StringDtype("pyarrow")}.get)
    names = pc.dictionary_encode(base.column("name")).combine_chunks()
    df["name"] = pd.Categorical.from_codes(names.indices.to_numpy(), categories=names.dictionary.to_pylist())
    kind = _field(spans, "kind")
    if kind is not None and not pa.types.is_integer(kind.type):
        raise TypeError("kind must be an integer")
    df["kind"] = pc.fill_null(kind, 0).to_numpy() if kind is not None else np.zeros(n, dtype="int64")
    df["service"] = pd.Categorical(services[ss_parent[sp_parent]] if n else np.array([], dtype=object))
    df["start_ns"] = _ns(_field(spans, "startTimeUnixNano"), n)
    df["end_ns"] = _ns(_field(spans, "endTimeUnixNano"), n)
    status = _field(spans, "status")
    code = _field(status, "code") if status is not None else None
    df["status_code"] = pc.fill_null(code, 0).to_numpy() if code is not None and pa.types.is_integer(code.type) else 0

    attrs = _list_children(_field(spans, "attributes"))
    if attrs is not None and len(attrs[0]):
        kvs, parent = attrs
        keys = _field(kvs, "key")
        values = _field(kvs, "value")
        if keys is None or values is None or not pa.types.is_string(keys.type):
            raise TypeError("attributes need string keys and AnyValue values")
        encoded = pc.dictionary_encode(keys).combine_chunks() if isinstance(keys, pa.ChunkedArray) else pc.dictionary_encode(keys)
        codes = encoded.indices.to_numpy(zero_copy_only=False)
        extra: dict[int, dict[str, Any]] = {}
        for code_i, key in enumerate(encoded.dictionary.to_pylist()):
            mask = codes == code_i
            if not mask.any():
                continue
            rows = parent[mask]
            vals = values.filter(pa.array(mask))
            if key in known:
                df[key] = _typed_values(vals, n, rows)
            else:
                for row, v in zip(rows.tolist(), vals.to_pylist()):
                    extra.setdefault(row, {})[key] = _clean(v)
        if extra:
            col = np.full(n, None, dtype=object)
            for row, d in extra.items():
                col[row] = d
            df["extra"] = col
    return df


__all__: list[str] = ["read_spans_arrow"]
