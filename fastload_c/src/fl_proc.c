#define _GNU_SOURCE
#include "fl_proc.h"

#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <unistd.h>
#ifdef __GLIBC__
#include <malloc.h>
#endif

/* Read by the handler, written by threads: every slot is an atomic pointer. */
static fl_doorbell *doorbells[FL_PROC_MAX_DOORBELLS];
/* The handlers ours replaced, newest first: one link per installation, each
 * never changed or freed once published, since a handler running on another
 * thread may be reading it while install() runs again. */
struct chained {
    struct sigaction action;
    const struct chained *older;
};
static const struct chained *newest;
static uint64_t sigchld_count;
/* Handlers running now; remove waits for it to drop to zero so that a
 * doorbell is never rung after its owner unmapped it. */
static int handlers_running;
/* The link this thread's handler is chaining through, NULL outside it. A
 * chain can lead back into ours: installed, replaced by a handler that
 * chains to ours, installed again over that one. Re-entered so, ours only
 * goes on to the next older link, so the chain ends after every handler ran
 * once, instead of recursing until the stack ends. initial-exec: a
 * general-dynamic TLS access may allocate, which a signal handler must not. */
static __thread const struct chained *chaining_through __attribute__((tls_model("initial-exec")));

static void on_sigchld(int sig, siginfo_t *info, void *context)
{
    const struct chained *link;
    int saved_errno = errno;
    if (chaining_through != NULL) {
        link = chaining_through->older;
    } else {
        /* seq_cst, here and in fl_proc_remove_doorbell: each side writes one
         * variable then reads the other's (counter then slots here, slot
         * then counter there). Only the single total order of seq_cst
         * forbids both reading the old values, i.e. the remover seeing no
         * handler running while this one rings the doorbell it takes away. */
        __atomic_add_fetch(&handlers_running, 1, __ATOMIC_SEQ_CST);
        __atomic_add_fetch(&sigchld_count, 1, __ATOMIC_RELEASE);
        for (int i = 0; i < FL_PROC_MAX_DOORBELLS; i++) {
            fl_doorbell *db = __atomic_load_n(&doorbells[i], __ATOMIC_SEQ_CST);
            if (db != NULL)
                fl_doorbell_ring(db);
        }
        __atomic_sub_fetch(&handlers_running, 1, __ATOMIC_SEQ_CST);
        link = __atomic_load_n(&newest, __ATOMIC_ACQUIRE);
    }
    errno = saved_errno;
    if (link == NULL)
        return;
    const struct chained *outer = chaining_through;
    chaining_through = link;
    if (link->action.sa_flags & SA_SIGINFO) {
        if (link->action.sa_sigaction != NULL)
            link->action.sa_sigaction(sig, info, context);
    } else if (link->action.sa_handler != SIG_DFL && link->action.sa_handler != SIG_IGN) {
        link->action.sa_handler(sig);
    }
    chaining_through = outer;
}

/* A forked worker inherits the handler but not the parent's job of waiting:
 * the doorbells it would ring belong to the parent's loaders. */
static void forget_doorbells_in_child(void)
{
    for (int i = 0; i < FL_PROC_MAX_DOORBELLS; i++)
        __atomic_store_n(&doorbells[i], NULL, __ATOMIC_RELEASE);
}

int fl_proc_install_sigchld(void)
{
    static int atfork_registered;
    struct sigaction action, current;
    /* Installed, and still ours? Someone may have replaced it since (torch's
     * DataLoader installs its own with signal.signal): then install again,
     * chaining to the newcomer. */
    if (sigaction(SIGCHLD, NULL, &current) != 0)
        return -1;
    if ((current.sa_flags & SA_SIGINFO) && current.sa_sigaction == on_sigchld)
        return 0;
    if (!atfork_registered) {
        int rc = pthread_atfork(NULL, NULL, forget_doorbells_in_child);
        if (rc != 0) {
            errno = rc;
            return -1;
        }
        atfork_registered = 1;
    }
    if (!(current.sa_flags & SA_SIGINFO) && current.sa_handler == SIG_IGN) {
        /* SIG_IGN asks the kernel to reap children itself; keep that promise
         * to whoever set it rather than leave zombies behind. */
        errno = EBUSY;
        return -1;
    }
    /* Publish what to chain to before the handler can run. Rare (once, and
     * again only after someone replaced ours), so links are never freed. */
    struct chained *link = malloc(sizeof *link);
    if (link == NULL)
        return -1;
    link->action = current;
    link->older = newest;
    __atomic_store_n(&newest, link, __ATOMIC_RELEASE);
    memset(&action, 0, sizeof action);
    action.sa_sigaction = on_sigchld;
    action.sa_flags = SA_SIGINFO | SA_RESTART | SA_NOCLDSTOP;
    sigemptyset(&action.sa_mask);
    return sigaction(SIGCHLD, &action, NULL);
}

int fl_proc_add_doorbell(fl_doorbell *db)
{
    for (int i = 0; i < FL_PROC_MAX_DOORBELLS; i++) {
        fl_doorbell *expected = NULL;
        if (__atomic_compare_exchange_n(&doorbells[i], &expected, db, 0,
                                        __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
            return 0;
    }
    errno = ENOSPC;
    return -1;
}

void fl_proc_remove_doorbell(fl_doorbell *db)
{
    for (int i = 0; i < FL_PROC_MAX_DOORBELLS; i++) {
        fl_doorbell *expected = db;
        __atomic_compare_exchange_n(&doorbells[i], &expected, NULL, 0,
                                    __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
    }
    /* seq_cst: see on_sigchld. */
    while (__atomic_load_n(&handlers_running, __ATOMIC_SEQ_CST) != 0)
        sched_yield();
}

uint64_t fl_proc_sigchld_count(void)
{
    return __atomic_load_n(&sigchld_count, __ATOMIC_ACQUIRE);
}

int fl_proc_die_with_parent(int sig, int expected_parent)
{
    if (prctl(PR_SET_PDEATHSIG, sig, 0, 0, 0) != 0)
        return -1;
    if (getppid() != expected_parent) {
        errno = ESRCH;
        return -1;
    }
    return 0;
}

int fl_proc_keep_freed_heap(size_t keep_bytes, size_t block_bytes)
{
    /* Under AddressSanitizer malloc is not glibc's, and mallopt is a no-op
     * that reports failure. */
#if defined(__GLIBC__) && !defined(__SANITIZE_ADDRESS__)
    if (keep_bytes > INT_MAX || block_bytes > INT_MAX) {
        errno = EINVAL;
        return -1;
    }
    /* mallopt returns 1 on success, 0 on error (without errno). */
    if (mallopt(M_TRIM_THRESHOLD, (int)keep_bytes) != 1
        || mallopt(M_MMAP_THRESHOLD, (int)block_bytes) != 1) {
        errno = EINVAL;
        return -1;
    }
#endif
    return 0;
}
