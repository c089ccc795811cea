"""`python -m memslice`: the same command as the installed `memslice` (cli.py keeps kubernetes_validate out)."""

from .cli import main

raise SystemExit(main())
