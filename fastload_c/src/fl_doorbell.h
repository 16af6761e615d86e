/* A doorbell: an event counter in shared memory that waiters sleep on.
 *
 * Header-only so that a signal handler in another extension (fastload_c.proc,
 * on SIGCHLD) can ring the doorbell the main process sleeps on. The ring's
 * "data available" and "space available" events are doorbells too.
 *
 * NOTE [ Doorbell protocol ]
 * `seq` counts rings; `sleepers` counts waiters inside fl_doorbell_wait().
 * A waiter reads `seen = fl_doorbell_seq()` BEFORE checking its condition
 * (data in a ring, a dead child, ...), and sleeps with
 * fl_doorbell_wait(db, seen, deadline) only if the condition was false.
 * An event source first makes its event visible (publishes the message,
 * records the exit status), then calls fl_doorbell_ring().
 *
 * No wakeup is lost: the ringer does {seq += 1; load sleepers} and the waiter
 * does {sleepers += 1; load seq; futex-wait while seq == seen;
 * sleepers -= 1}, all seq_cst. In the single total order of seq_cst
 * operations either the waiter's load sees the new seq (it does not sleep),
 * or the ringer's load sees sleepers > 0 (it issues FUTEX_WAKE, and the
 * kernel's own check of seq == seen under its hash-bucket lock closes the
 * remaining window).
 *
 * Only the waiter takes itself off the count. An earlier version had the
 * ringer clear a sleeper flag as it woke, to save wake calls while a woken
 * waiter waited for a CPU; it lost wakeups: a ringer whose increment a waiter
 * had already seen could clear the flag of that waiter's next wait, which
 * then slept with no flag for the ring that mattered (found by the two-
 * process stress test). The price of the count is a useless FUTEX_WAKE per
 * ring while a woken waiter has not run yet, and after a waiter was killed
 * in its sleep.
 * A ring that nobody waits for costs one atomic increment and one load: no
 * system call.
 *
 * Every field is accessed only through the atomics below. */
#ifndef FL_DOORBELL_H
#define FL_DOORBELL_H

#include <errno.h>
#include <limits.h>
#include <stdint.h>
#include <time.h>

#include "fl_futex.h"

typedef struct {
    uint32_t seq;      /* number of rings so far (wraps) */
    uint32_t sleepers; /* waiters inside fl_doorbell_wait() */
} fl_doorbell;

static inline uint32_t fl_doorbell_seq(fl_doorbell *db)
{
    return __atomic_load_n(&db->seq, __ATOMIC_SEQ_CST);
}

/* Async-signal-safe: lock-free atomics and at most one syscall, and errno is
 * preserved, so a signal handler may call it directly. */
static inline void fl_doorbell_ring(fl_doorbell *db)
{
    __atomic_fetch_add(&db->seq, 1, __ATOMIC_SEQ_CST);
    if (__atomic_load_n(&db->sleepers, __ATOMIC_SEQ_CST) != 0) {
        int saved = errno;
        fl_futex_wake(&db->seq, INT_MAX);
        errno = saved;
    }
}

/* Sleep until the doorbell rings after `seen_seq` was read, or until the
 * deadline (absolute CLOCK_MONOTONIC, NULL = none). Returns 0 when it rang
 * (or spuriously: callers re-check their condition and loop), -1 with errno
 * ETIMEDOUT or EINTR, or another errno from the futex. */
static inline int fl_doorbell_wait(fl_doorbell *db, uint32_t seen_seq, const struct timespec *deadline)
{
    int rc = 0;
    __atomic_fetch_add(&db->sleepers, 1, __ATOMIC_SEQ_CST);
    if (__atomic_load_n(&db->seq, __ATOMIC_SEQ_CST) == seen_seq)
        rc = fl_futex_wait(&db->seq, seen_seq, deadline);
    __atomic_fetch_sub(&db->sleepers, 1, __ATOMIC_SEQ_CST);
    return rc;
}

#endif
