/* fl_proc: SIGCHLD rings registered doorbells, chains to the handler before
 * it without ever recursing, and never rings a doorbell after its removal
 * returned; the worker-side helpers. */
#include "check.h"
#include "fl_proc.h"

#include <limits.h>

static const struct timespec *after(double seconds, struct timespec *ts)
{
    fl_deadline_after(seconds, ts);
    return ts;
}

static int user_calls, chaining_calls;
static struct sigaction before_chaining;

static void user_handler(int sig, siginfo_t *info, void *context)
{
    user_calls++;
}

/* A handler that, like ours, chains to whatever it replaced. */
static void chaining_handler(int sig, siginfo_t *info, void *context)
{
    chaining_calls++;
    before_chaining.sa_sigaction(sig, info, context);
}

static void install(void (*handler)(int, siginfo_t *, void *), struct sigaction *old)
{
    struct sigaction action;
    memset(&action, 0, sizeof action);
    action.sa_sigaction = handler;
    action.sa_flags = SA_SIGINFO | SA_RESTART;
    sigemptyset(&action.sa_mask);
    CHECK(sigaction(SIGCHLD, &action, old) == 0);
}

static void exit_at_once(void *arg)
{
}

static void test_child_exit_rings_and_chains(fl_doorbell *db)
{
    struct timespec ts;
    install(user_handler, NULL);
    CHECK(fl_proc_install_sigchld() == 0);
    CHECK(fl_proc_install_sigchld() == 0);  /* idempotent */
    CHECK(fl_proc_add_doorbell(db) == 0);
    uint64_t count = fl_proc_sigchld_count();
    uint32_t seen = fl_doorbell_seq(db);
    peer p = peer_start(1, exit_at_once, NULL);
    while (fl_doorbell_seq(db) == seen)
        CHECK(fl_doorbell_wait(db, seen, after(10, &ts)) == 0 || errno == EINTR);
    peer_join(p);
    CHECK(fl_proc_sigchld_count() > count && user_calls > 0);
}

static void test_chain_back_to_ours_does_not_recurse(fl_doorbell *db)
{
    /* Ours, replaced by a handler chaining to ours, then ours again: the
     * chain leads back into ours, which must not go round again. */
    install(chaining_handler, &before_chaining);
    CHECK(fl_proc_install_sigchld() == 0);
    int users = user_calls;
    uint32_t seen = fl_doorbell_seq(db);
    CHECK(raise(SIGCHLD) == 0);
    CHECK(chaining_calls == 1 && user_calls == users + 1);
    CHECK(fl_doorbell_seq(db) == seen + 1);
}

static void test_removed_doorbells_are_not_rung(fl_doorbell *db)
{
    fl_doorbell *many[FL_PROC_MAX_DOORBELLS];
    for (int i = 1; i < FL_PROC_MAX_DOORBELLS; i++) {
        many[i] = shared_zeroed(sizeof *many[i]);
        CHECK(fl_proc_add_doorbell(many[i]) == 0);
    }
    fl_doorbell extra = {0, 0};
    errno = 0;
    CHECK(fl_proc_add_doorbell(&extra) == -1 && errno == ENOSPC);
    for (int i = 1; i < FL_PROC_MAX_DOORBELLS; i++) {
        fl_proc_remove_doorbell(many[i]);
        CHECK(munmap(many[i], sizeof *many[i]) == 0);
    }
    fl_proc_remove_doorbell(db);
    fl_proc_remove_doorbell(db);  /* not registered: nothing */
    uint32_t seen = fl_doorbell_seq(db);
    CHECK(raise(SIGCHLD) == 0);
    CHECK(fl_doorbell_seq(db) == seen);
}

static volatile int stop_signalling;

static void *signal_forever(void *arg)
{
    while (!stop_signalling)
        kill(getpid(), SIGCHLD);
    return NULL;
}

static void test_remove_waits_for_running_handlers(void)
{
    /* Unmapping right after removal must be safe while signals keep coming
     * (a ring after the unmap would be SIGSEGV, or an ASan report). */
    pthread_t thread;
    CHECK(pthread_create(&thread, NULL, signal_forever, NULL) == 0);
    for (int i = 0; i < 20000; i++) {
        fl_doorbell *db = shared_zeroed(sizeof *db);
        CHECK(fl_proc_add_doorbell(db) == 0);
        fl_proc_remove_doorbell(db);
        CHECK(munmap(db, sizeof *db) == 0);
    }
    stop_signalling = 1;
    CHECK(pthread_join(thread, NULL) == 0);
}

static void in_child(void *db)
{
    /* A forked child inherits the handler, not the parent's doorbells. */
    uint32_t seen = fl_doorbell_seq(db);
    CHECK(raise(SIGCHLD) == 0);
    CHECK(fl_doorbell_seq(db) == seen);
    /* SIG_IGN (the kernel reaps children) is left as it is. */
    CHECK(signal(SIGCHLD, SIG_IGN) != SIG_ERR);
    errno = 0;
    CHECK(fl_proc_install_sigchld() == -1 && errno == EBUSY);
    struct sigaction now;
    CHECK(sigaction(SIGCHLD, NULL, &now) == 0 && now.sa_handler == SIG_IGN);
    errno = 0;
    CHECK(fl_proc_die_with_parent(SIGKILL, getppid() + 1) == -1 && errno == ESRCH);
    CHECK(fl_proc_die_with_parent(SIGKILL, getppid()) == 0);
}

static void test_fork_and_worker_helpers(fl_doorbell *db)
{
    CHECK(fl_proc_add_doorbell(db) == 0);
    peer p = peer_start(1, in_child, db);
    peer_join(p);
    fl_proc_remove_doorbell(db);
    CHECK(fl_proc_keep_freed_heap(1 << 20, 1 << 20) == 0);
#if defined(__GLIBC__) && !defined(__SANITIZE_ADDRESS__)
    errno = 0;
    CHECK(fl_proc_keep_freed_heap((size_t)INT_MAX + 1, 0) == -1 && errno == EINVAL);
#endif
}

int main(void)
{
    fl_doorbell *db = shared_zeroed(sizeof *db);
    test_child_exit_rings_and_chains(db);
    test_chain_back_to_ours_does_not_recurse(db);
    test_removed_doorbells_are_not_rung(db);
    test_remove_waits_for_running_handlers();
    test_fork_and_worker_helpers(db);
    puts("ok");
    return 0;
}
