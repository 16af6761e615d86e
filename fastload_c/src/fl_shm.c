#define _GNU_SOURCE
#include "fl_shm.h"

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23 /* Linux 5.14; older C headers lack the name */
#endif

static int map_shared(int fd, size_t size, void **addr_out)
{
    void *addr = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (addr == MAP_FAILED)
        return -1;
    *addr_out = addr;
    return 0;
}

/* Read one unsigned number from a file, scaled by `unit`; 0 when unreadable
 * or not a number (cgroup files say "max" for no limit). */
static unsigned long long read_number(const char *path, const char *key, unsigned long long unit)
{
    char line[256];
    unsigned long long value = 0;
    FILE *f = fopen(path, "re");
    if (f == NULL)
        return 0;
    size_t keylen = key ? strlen(key) : 0;
    while (fgets(line, sizeof line, f) != NULL) {
        if (key && strncmp(line, key, keylen) != 0)
            continue;
        if (sscanf(line + keylen, "%llu", &value) != 1)
            value = 0;
        break;
    }
    fclose(f);
    return value * unit;
}

static unsigned long long cgroup_room(const char *limit_path, const char *usage_path)
{
    unsigned long long limit = read_number(limit_path, NULL, 1);
    unsigned long long usage = read_number(usage_path, NULL, 1);
    if (limit == 0)
        return ~0ULL;
    return limit > usage ? limit - usage : 0;
}

/* The least room under the limits of cgroup `path` in the hierarchy mounted
 * at `mount` and of each of its ancestors: a parent's limit binds its
 * children too, and a process may sit in a nested group (a systemd slice, a
 * container without its own cgroup namespace) whose own file says "max". */
static unsigned long long hierarchy_room(const char *mount, const char *path,
                                         const char *limit_name, const char *usage_name)
{
    char dir[4096], limit[4200], usage[4200];
    unsigned long long room = ~0ULL;
    size_t root = strlen(mount);
    int n = snprintf(dir, sizeof dir, "%s%s", mount, path);
    if (n < 0 || (size_t)n >= sizeof dir)
        return room;
    for (;;) {
        size_t len = strlen(dir);
        while (len > root && dir[len - 1] == '/')
            dir[--len] = '\0';
        snprintf(limit, sizeof limit, "%s/%s", dir, limit_name);
        snprintf(usage, sizeof usage, "%s/%s", dir, usage_name);
        unsigned long long here = cgroup_room(limit, usage);
        if (here < room)
            room = here;
        char *slash = strrchr(dir + root, '/');
        if (len <= root || slash == NULL)
            return room;
        *slash = '\0';
    }
}

unsigned long long fl_shm_cgroup_room(const char *proc_cgroup, const char *sysfs)
{
    /* Lines of /proc/self/cgroup are "id:controllers:path": "0::path" for
     * the unified (v2) hierarchy, "N:memory:path" (or "N:a,memory:path")
     * for v1's memory controller. */
    char line[4096], mount[4096];
    unsigned long long room = ~0ULL;
    FILE *f = fopen(proc_cgroup, "re");
    if (f == NULL)
        return room;
    while (fgets(line, sizeof line, f) != NULL) {
        line[strcspn(line, "\n")] = '\0';
        char *controllers = strchr(line, ':');
        char *path = controllers ? strchr(controllers + 1, ':') : NULL;
        if (path == NULL)
            continue;
        *controllers++ = '\0';
        *path++ = '\0';
        unsigned long long here = ~0ULL;
        if (strcmp(line, "0") == 0 && *controllers == '\0') {
            here = hierarchy_room(sysfs, path, "memory.max", "memory.current");
        } else {
            char *save = NULL;
            for (char *c = strtok_r(controllers, ",", &save); c != NULL;
                 c = strtok_r(NULL, ",", &save))
                if (strcmp(c, "memory") == 0) {
                    snprintf(mount, sizeof mount, "%s/memory", sysfs);
                    here = hierarchy_room(mount, path, "memory.limit_in_bytes",
                                          "memory.usage_in_bytes");
                    break;
                }
        }
        if (here < room)
            room = here;
    }
    fclose(f);
    return room;
}

size_t fl_shm_available(void)
{
    /* Shared memory is charged like anonymous memory: a segment larger than
     * what the kernel can still give would make fallocate run the machine
     * into the OOM killer instead of failing, so refuse it up front. */
    unsigned long long room = read_number("/proc/meminfo", "MemAvailable:", 1024);
    unsigned long long cgroup = fl_shm_cgroup_room("/proc/self/cgroup", "/sys/fs/cgroup");
    if (room == 0)
        room = ~0ULL;
    if (cgroup < room)
        room = cgroup;
    return room > (unsigned long long)SIZE_MAX ? SIZE_MAX : (size_t)room;
}

int fl_shm_create(const char *label, size_t size, int *fd_out, void **addr_out)
{
    if (size == 0) {
        errno = EINVAL;
        return -1;
    }
    if (size > fl_shm_available()) {
        errno = ENOMEM;
        return -1;
    }
    int fd = memfd_create(label, MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd < 0)
        return -1;
    /* posix_fallocate returns the error instead of setting errno. */
    int rc;
    do
        rc = posix_fallocate(fd, 0, (off_t)size);
    while (rc == EINTR);
    if (rc != 0) {
        close(fd);
        errno = rc;
        return -1;
    }
    /* Sized for good: any process holding the descriptor could otherwise
     * ftruncate it and turn every mapping's next touch past the end into
     * SIGBUS. Contents stay writable. */
    if (fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0
        || map_shared(fd, size, addr_out) != 0) {
        int saved = errno;
        close(fd);
        errno = saved;
        return -1;
    }
    *fd_out = fd;
    return 0;
}

int fl_shm_attach(int fd, size_t size, void **addr_out)
{
    struct stat st;
    if (size == 0) {
        errno = EINVAL;
        return -1;
    }
    /* A descriptor received over a socket without MSG_CMSG_CLOEXEC is
     * inheritable: a program the process execs must not get it. */
    int flags = fcntl(fd, F_GETFD);
    if (flags < 0 || fcntl(fd, F_SETFD, flags | FD_CLOEXEC) != 0)
        return -1;
    if (fstat(fd, &st) != 0)
        return -1;
    if ((size_t)st.st_size < size) {
        errno = EINVAL;
        return -1;
    }
    return map_shared(fd, size, addr_out);
}

int fl_shm_unmap(void *addr, size_t size)
{
    return munmap(addr, size);
}
