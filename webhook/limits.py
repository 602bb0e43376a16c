"""The open files `serve` may hold, and so the connections it can keep within them.

Each connection is a file descriptor, and an accept beyond RLIMIT_NOFILE fails (EMFILE): libuv
then accepts and closes the waiting connections unanswered (src/unix/stream.c, uv__emfile_trick),
the apiserver's among them. Container runtimes often start a process with a soft limit of 1,024
(systemd's default, which containerd 2.0 no longer raises): about what --max-connections holds.
"""

from __future__ import annotations

import resource

# The descriptors `serve` holds besides its connections: standard streams, the listening sockets,
# the event loop's own, /metrics, the API client's connections and watches, files being read.
# Some thirty in a running webhook; twice that leaves room.
RESERVED_FILES = 64


def raise_open_files_limit() -> int:
    """Raise the soft RLIMIT_NOFILE to the hard one, as Go's runtime does at start since Go 1.19
    (syscall/rlimit.go, first os/rlimit.go): the low soft limit exists for programs using
    select(2), and nothing in `serve` does (uvloop polls with epoll, urllib3 with poll). Returns the
    soft limit in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft == resource.RLIM_INFINITY or soft >= hard:
        # An infinite hard limit cannot be the soft one of RLIMIT_NOFILE on Linux (nr_open caps it).
        return soft if soft != resource.RLIM_INFINITY else 1 << 30
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    except (ValueError, OSError):
        return soft
    return hard


def connection_bound(wanted: int, open_files: int) -> int:
    """The most connections `serve` can hold: `wanted` (--max-connections), unless the open files
    it may hold leave room for fewer."""
    return max(1, min(wanted, open_files - RESERVED_FILES))
