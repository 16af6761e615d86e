/* Anonymous shared memory segments: memfd + fallocate + mmap.
 *
 * Plain C, no Python: every function returns 0 on success or -1 with errno
 * set, and never blocks on anything but the kernel. */
#ifndef FL_SHM_H
#define FL_SHM_H

#include <stddef.h>

/* Bytes of memory a new segment can still take: the smaller of the kernel's
 * MemAvailable and the room left under this process's memory cgroup limit. */
size_t fl_shm_available(void);

/* Room left under the memory limits of this process's cgroups, as listed in
 * `proc_cgroup` (/proc/self/cgroup), v2 and v1 hierarchies mounted under
 * `sysfs` (/sys/fs/cgroup), each group and its ancestors: the least of
 * them; ~0 when no limit applies. */
unsigned long long fl_shm_cgroup_room(const char *proc_cgroup, const char *sysfs);

/* Create a memfd of `size` bytes with every page reserved up front, so that a
 * shortage of memory fails here (ENOSPC/ENOMEM) rather than as SIGBUS on first
 * touch, sealed against any change of size, close-on-exec, and map it shared
 * read-write. `size` must be > 0 and no more than
 * fl_shm_available() (else ENOMEM). */
int fl_shm_create(const char *label, size_t size, int *fd_out, void **addr_out);

/* Map an existing segment received as a descriptor, which becomes
 * close-on-exec. Fails with EINVAL when the file is smaller than `size`
 * (touching past its end would be SIGBUS). */
int fl_shm_attach(int fd, size_t size, void **addr_out);

/* Unmap a mapping made by create or attach. */
int fl_shm_unmap(void *addr, size_t size);

#endif
