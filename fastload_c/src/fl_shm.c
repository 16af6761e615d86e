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

size_t fl_shm_available(void)
{
    /* Shared memory is charged like anonymous memory: a segment larger than
     * what the kernel can still give would make fallocate run the machine
     * into the OOM killer instead of failing, so refuse it up front. */
    unsigned long long room = read_number("/proc/meminfo", "MemAvailable:", 1024);
    unsigned long long v2 = cgroup_room("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current");
    unsigned long long v1 = cgroup_room("/sys/fs/cgroup/memory/memory.limit_in_bytes",
                                        "/sys/fs/cgroup/memory/memory.usage_in_bytes");
    if (room == 0)
        room = ~0ULL;
    if (v2 < room)
        room = v2;
    if (v1 < room)
        room = v1;
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
    int fd = memfd_create(label, MFD_CLOEXEC);
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
    if (map_shared(fd, size, addr_out) != 0) {
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

int fl_shm_prefault(void *addr, size_t size)
{
    if (madvise(addr, size, MADV_POPULATE_WRITE) == 0)
        return 0;
    /* EINVAL: a kernel older than 5.14. Anything else is a real failure. */
    if (errno != EINVAL)
        return -1;
    long page = sysconf(_SC_PAGESIZE);
    if (page <= 0)
        return -1;
    for (size_t off = 0; off < size; off += (size_t)page)
        __atomic_fetch_add((char *)addr + off, 0, __ATOMIC_RELAXED);
    return 0;
}

int fl_shm_pin(void *addr, size_t size)
{
    if (mlock(addr, size) != 0)
        return -1;
    /* mlock faults pages in for reading; make the entries writable too. */
    if (fl_shm_prefault(addr, size) != 0) {
        int saved = errno;
        munlock(addr, size);
        errno = saved;
        return -1;
    }
    return 0;
}

int fl_shm_unpin(void *addr, size_t size)
{
    return munlock(addr, size);
}
