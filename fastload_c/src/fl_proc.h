/* Worker lifecycle mechanism: a SIGCHLD handler that wakes waiters, and the
 * parent-death signal for workers.
 *
 * NOTE [ Worker-death detection ]
 * The main process sleeps on a doorbell (fl_doorbell.h) while it waits for
 * results. When a worker dies it writes nothing, so that sleep would last
 * until the deadline. The SIGCHLD handler installed here rings every
 * registered doorbell, so the waiter wakes at once, sees that no result
 * arrived, and polls its own workers (multiprocessing's Process.exitcode, a
 * waitpid(WNOHANG) of that one pid). The handler reaps nothing and knows no
 * pids: it cannot take a child from its rightful owner (multiprocessing,
 * subprocess, the user), and it does the least possible work in signal
 * context. It chains to the handler that was installed before it, so a
 * user's SIGCHLD handler keeps working.
 */
#ifndef FL_PROC_H
#define FL_PROC_H

#include <signal.h>
#include <stddef.h>
#include <stdint.h>

#include "fl_doorbell.h"

#define FL_PROC_MAX_DOORBELLS 64

/* Install the handler (idempotent while it stays installed; installed again,
 * chaining, when another handler replaced it). 0, or -1 with errno. */
int fl_proc_install_sigchld(void);

/* Register a doorbell to ring on SIGCHLD. -1 with ENOSPC when all
 * FL_PROC_MAX_DOORBELLS places are taken. */
int fl_proc_add_doorbell(fl_doorbell *db);

/* Stop ringing a doorbell. Its memory must stay mapped until this returns. */
void fl_proc_remove_doorbell(fl_doorbell *db);

/* Number of SIGCHLD signals seen since installation. */
uint64_t fl_proc_sigchld_count(void);

/* In a worker: be sent `sig` when the parent exits. Fails with ESRCH when
 * the parent is already gone (getppid() != expected_parent), closing the
 * race of a parent that died before the signal was armed. */
int fl_proc_die_with_parent(int sig, int expected_parent);

/* Have malloc keep up to `keep_bytes` of freed memory instead of returning
 * it to the kernel, and serve blocks up to `block_bytes` from the heap
 * (glibc's mallopt; elsewhere, sanitizer builds included, it does nothing
 * and returns 0). 0, or -1 with
 * errno EINVAL when glibc refuses a value. */
int fl_proc_keep_freed_heap(size_t keep_bytes, size_t block_bytes);

#endif
