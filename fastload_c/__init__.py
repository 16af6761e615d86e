"""fastload_c: the compiled mechanism under fastload (shared memory, rings,
slabs, worker signals). It never imports fastload."""
import os

try:
    from fastload_c import shm as _shm  # noqa: F401
except ImportError as exc:  # pragma: no cover - exercised only on broken installs
    here = os.path.dirname(os.path.abspath(__file__))
    hint = ""
    if os.path.exists(os.path.join(here, "shm.pyx")):
        # A source checkout shadows an installed copy when Python runs from it.
        hint = ("\nPython is importing the source checkout at {}: build it in place "
                "(`pip install -e .`) or run from another directory.".format(here))
    raise ImportError(
        "fastload's compiled core (fastload_c) is not built: {}.\n"
        "Build it with `pip install .` (or `pip install -e .` from a checkout); "
        "this needs a C compiler, Cython>=3 and numpy.{}".format(exc, hint)
    ) from exc
