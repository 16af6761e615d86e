from libc.stdint cimport uint64_t

from fastload_c.ring cimport fl_doorbell


cdef extern from "fl_proc.h" nogil:
    int FL_PROC_MAX_DOORBELLS
    int fl_proc_install_sigchld()
    int fl_proc_add_doorbell(fl_doorbell *db)
    void fl_proc_remove_doorbell(fl_doorbell *db)
    uint64_t fl_proc_sigchld_count()
    int fl_proc_die_with_parent(int sig, int expected_parent)
    int fl_proc_keep_freed_heap(size_t keep_bytes, size_t block_bytes)
