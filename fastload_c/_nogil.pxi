# Copies of at least this many bytes run without the GIL; for smaller ones,
# dropping and retaking it costs more than the copy (NOTE [ Copies and the
# GIL ] in pack.pyx).
cdef enum:
    NOGIL_MIN_BYTES = 131072
