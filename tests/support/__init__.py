"""What the tests share: capture builders, server and process helpers, fakes at the hardware
boundary. Importable as ``support.*`` (``tests`` is on pytest's ``pythonpath``)."""
