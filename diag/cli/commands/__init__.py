"""One module per ``ttft`` sub-command: each has ``add_parser(subparsers)`` and ``run(args)``."""
