"""One pure-data module per external engine: what it names (spans, attributes, notes), each name
with the file and commit of the engine's source it was read from. Read by :mod:`diag.external_spans`
and :mod:`diag.external_frames`; no I/O, any thread.
"""
