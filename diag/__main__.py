"""``python -m diag`` is the ``ttft`` command."""

import sys

from diag.cli import main

sys.exit(main())
