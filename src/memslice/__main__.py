import sys

# The kubernetes package imports its dynamic client, which imports kubernetes-validate where that is installed (it
# is in the test extra, so in every development venv); with it come jsonschema and rfc3987-syntax, which compiles
# a grammar as it is imported: 2.5 s of CPU in each memslice process that talks to the API server, for a
# validator memslice never calls. None in sys.modules makes that optional import fail as if the package were
# absent, as it is in the image.
# (None is Python's documented "not importable" entry, which typeshed does not allow for)
sys.modules.setdefault("kubernetes_validate", None)  # type: ignore[arg-type]

from .cli import main  # noqa: E402 (after the line above)

raise SystemExit(main())
