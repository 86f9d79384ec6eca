"""Holds ``sitecustomize.py``, put on COMMAND's PYTHONPATH by ``ttft instrument`` (not imported as a package)."""
