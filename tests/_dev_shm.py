"""/dev/shm as the tests see it on a machine shared with other programs."""
import os


def dev_shm_names():
    """Entries of /dev/shm, less those torch and multiprocessing make (torch_*,
    sem.*): other programs on a shared machine create and remove these at any
    moment, and fastload makes neither (its segments are memfds)."""
    return {name for name in os.listdir("/dev/shm") if not name.startswith(("torch_", "sem."))}
