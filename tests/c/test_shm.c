/* fl_shm: segments (sealed, close-on-exec, shared across fork), attach
 * checks, and the cgroup memory limit read along the process's own path. */
#include "check.h"
#include "fl_shm.h"

#include <fcntl.h>
#include <sys/stat.h>

static void test_segments_are_sealed_and_close_on_exec(void)
{
    int fd;
    void *addr;
    errno = 0;
    CHECK(fl_shm_create("t", 0, &fd, &addr) == -1 && errno == EINVAL);
    CHECK(fl_shm_create("t", (size_t)1 << 50, &fd, &addr) == -1 && errno == ENOMEM);
    CHECK(fl_shm_create("t", 1 << 16, &fd, &addr) == 0);
    CHECK(fcntl(fd, F_GETFD) & FD_CLOEXEC);
    int seals = fcntl(fd, F_GET_SEALS);
    CHECK(seals >= 0 && (seals & F_SEAL_SHRINK) && (seals & F_SEAL_GROW) && (seals & F_SEAL_SEAL));
    CHECK(ftruncate(fd, 0) == -1 && errno == EPERM);
    CHECK(ftruncate(fd, 1 << 17) == -1 && errno == EPERM);
    ((char *)addr)[(1 << 16) - 1] = 1;
    CHECK(fl_shm_unmap(addr, 1 << 16) == 0);
    CHECK(close(fd) == 0);
}

static void write_from_child(void *arg)
{
    int fd = *(int *)arg;
    void *mine;
    CHECK(fl_shm_attach(fd, 4096, &mine) == 0);
    memcpy(mine, "child", 6);
    CHECK(fl_shm_unmap(mine, 4096) == 0);
}

static void test_attach_checks_size_and_sets_close_on_exec(void)
{
    int fd;
    char *addr;
    CHECK(fl_shm_create("t", 4096, &fd, (void **)&addr) == 0);
    int received = fcntl(fd, F_DUPFD, 0);  /* as from recvmsg without MSG_CMSG_CLOEXEC */
    CHECK(received >= 0 && !(fcntl(received, F_GETFD) & FD_CLOEXEC));
    void *other;
    errno = 0;
    CHECK(fl_shm_attach(received, 8192, &other) == -1 && errno == EINVAL);
    CHECK(fl_shm_attach(received, 0, &other) == -1 && errno == EINVAL);
    CHECK(fl_shm_attach(-1, 4096, &other) == -1 && errno == EBADF);
    CHECK(fl_shm_attach(received, 4096, &other) == 0);
    CHECK(fcntl(received, F_GETFD) & FD_CLOEXEC);
    FOR_EACH_PEER_KIND(fork_it) {
        memset(addr, 0, 6);
        peer p = peer_start(fork_it, write_from_child, &received);
        peer_join(p);
        CHECK(memcmp(addr, "child", 6) == 0 && memcmp(other, "child", 6) == 0);
    }
    CHECK(fl_shm_unmap(other, 4096) == 0 && fl_shm_unmap(addr, 4096) == 0);
    CHECK(close(received) == 0 && close(fd) == 0);
}

static char root[] = "/tmp/fl_cgroup_XXXXXX";

static void put(const char *relative, const char *text)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%s", root, relative);
    for (char *slash = strchr(path + strlen(root) + 1, '/'); slash; slash = strchr(slash + 1, '/')) {
        *slash = '\0';
        CHECK(mkdir(path, 0700) == 0 || errno == EEXIST);
        *slash = '/';
    }
    FILE *f = fopen(path, "w");
    CHECK(f != NULL && fputs(text, f) >= 0 && fclose(f) == 0);
}

static unsigned long long room(const char *proc_cgroup)
{
    char proc[512], sysfs[512];
    put("proc_self_cgroup", proc_cgroup);
    snprintf(proc, sizeof proc, "%s/proc_self_cgroup", root);
    snprintf(sysfs, sizeof sysfs, "%s/sys", root);
    return fl_shm_cgroup_room(proc, sysfs);
}

static void test_cgroup_limit_is_read_along_the_own_path(void)
{
    CHECK(mkdtemp(root) != NULL);
    CHECK(room("0::/\n") == ~0ULL);  /* no files: no limit */
    /* v2: the group itself says max, its parent has the limit. */
    put("sys/memory.max", "max\n");
    put("sys/a/memory.max", "1000000\n");
    put("sys/a/memory.current", "400000\n");
    put("sys/a/b/memory.max", "max\n");
    put("sys/a/b/memory.current", "300000\n");
    CHECK(room("0::/a/b\n") == 600000);
    CHECK(room("0::/a/b/\n") == 600000);
    CHECK(room("0::/\n") == ~0ULL);
    put("sys/a/b/memory.max", "500000\n");
    CHECK(room("0::/a/b\n") == 200000);
    put("sys/a/b/memory.current", "900000\n");
    CHECK(room("0::/a/b\n") == 0);  /* over the limit: no room, not a wrap */
    /* v1: the memory controller's line, alone or with others. */
    put("sys/memory/memory.limit_in_bytes", "9223372036854771712\n");
    put("sys/memory/x/memory.limit_in_bytes", "5000\n");
    put("sys/memory/x/memory.usage_in_bytes", "1000\n");
    put("sys/memory/x/y/memory.limit_in_bytes", "9223372036854771712\n");
    put("sys/memory/x/y/memory.usage_in_bytes", "700\n");
    CHECK(room("5:pids:/x/y\n4:memory:/x/y\n0::/\n") == 4000);
    CHECK(room("4:cpu,memory:/x/y\n") == 4000);
    CHECK(room("4:cpu:/x/y\n") == ~0ULL);
    CHECK(room("4:memory:/x/y\n0::/a\n") == 4000 && room("0::/a\n4:memory:/x\n") == 4000);
    CHECK(room("garbage\n\n") == ~0ULL);
    char cleanup[600];
    snprintf(cleanup, sizeof cleanup, "rm -rf '%s'", root);
    CHECK(system(cleanup) == 0);
    CHECK(fl_shm_available() > 0);
}

int main(void)
{
    test_segments_are_sealed_and_close_on_exec();
    test_attach_checks_size_and_sets_close_on_exec();
    test_cgroup_limit_is_read_along_the_own_path();
    puts("ok");
    return 0;
}
