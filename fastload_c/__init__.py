"""fastload_c: the compiled mechanism under fastload (shared memory, rings,
slabs, worker signals). It never imports fastload."""

try:
    from fastload_c import shm as _shm  # noqa: F401
except ImportError as exc:  # pragma: no cover - exercised only on broken installs
    raise ImportError(
        "fastload's compiled core (fastload_c) is not built: {}.\n"
        "Build it with `pip install .` (or `pip install -e .` from a checkout); "
        "this needs a C compiler, Cython>=3 and numpy.".format(exc)
    ) from exc
