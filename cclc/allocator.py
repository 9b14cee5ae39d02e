"""Process-wide allocator settings for the command line (library code never changes them).

At hundreds of ranks a compile allocates and frees arrays of tens of MB to a GB many times
(5M-op columns, the 84M (op, link) pairs of a 4,096-GPU AllToAll, and their temporaries).
glibc serves blocks above its mmap threshold with fresh ``mmap`` pages and returns them on
free, so every such temporary is paid again in page faults and zeroing by the kernel: on the
8x8x8 ``auto`` compile that was 3.1 s of system time against 4.8 s of user time, and on the
4,096-GPU fat tree's AllToAll 63 s against 75 s (``/usr/bin/time``; on a virtual machine a
first touch of a page can cost more than zeroing it, so the figure varies from run to run).

So the command line serves every block from the heap (no ``mmap`` for single blocks, glibc's
``M_MMAP_MAX`` of 0) and never gives freed heap top back (``M_TRIM_THRESHOLD`` of -1): a freed
array's pages serve the next array without a fault. The price is the heap's fragmentation:
freed blocks in its middle stay with the process, and so does its top, up to the peak. On the
fat tree's AllToAll (``cclc compile benchmarks/machines/pods512_fattree.ccl --only tokens``,
three runs) the compile took 90-94 s instead of 120-140 s, at 9.1-10.1 GB peak instead of
8.1-8.3 GB; on the 8x8x8 compile, keeping the heap's top alone took the system time from 3.1 to
1.7 s (``benchmarks/compile_scale.py``). Keeping 1 GiB of the top, as it first did, still gave
back the tops that the AllToAll's gigabyte arrays free and faulted them in again: never
trimming took that compile (``--emit json``, ``/usr/bin/time``, four runs each, alternately on
one machine) from 53.7-60.8 s wall and 14.3-18.3 s of system time to 50.5-53.2 s and 11.2-13.1
s, at 6.0-6.1 GB peak instead of 5.9-6.0 GB (the fabric's AllReduce: 18.4-19.3 s either way,
3.5 GB peak instead of 3.4). Only the ``cclc`` program sets this (:func:`cclc.cli.program`): a
process that calls :func:`cclc.cli.main` keeps its allocator.
"""

from __future__ import annotations

import ctypes
import ctypes.util

__all__ = ["reuse_freed_memory"]

#: glibc mallopt() parameters (malloc.h)
_M_TRIM_THRESHOLD = -1
_M_MMAP_MAX = -4
#: ``M_TRIM_THRESHOLD`` that never gives the heap's top back (mallopt(3): -1 disables trimming)
NEVER_TRIM = -1


def reuse_freed_memory() -> bool:
    """Ask glibc to serve every block from its heap and keep freed memory for reuse (see the
    module docstring); ``False`` where the C library is not glibc or refuses (what it took
    stays; nothing else changes)."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    return bool(mallopt(_M_MMAP_MAX, 0)) and bool(mallopt(_M_TRIM_THRESHOLD, NEVER_TRIM))
