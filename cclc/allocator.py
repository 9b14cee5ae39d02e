"""Process-wide allocator settings for the command line (library code never changes them).

At hundreds of ranks a compile allocates and frees arrays of tens to hundreds of MB many times
(5M-op columns and their temporaries). glibc serves blocks above its mmap threshold with fresh
``mmap`` pages and returns them on free, so every such temporary is paid again in page faults
and zeroing by the kernel: on the 8x8x8 ``auto`` compile that was 3.1 s of system time against
4.8 s of user time. Serving blocks up to 32 MB (glibc's largest threshold) from the heap and
keeping up to 1 GiB of freed heap for reuse cut the system time to 1.7 s, for about 0.1 GB more
peak memory (``benchmarks/compile_scale.py``).
"""

from __future__ import annotations

import ctypes
import ctypes.util

__all__ = ["reuse_freed_memory"]

#: glibc mallopt() parameters (malloc.h)
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3


def reuse_freed_memory() -> bool:
    """Ask glibc to keep freed memory for reuse (see the module docstring); ``False`` where
    the C library is not glibc or refuses (nothing changes then)."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    return bool(mallopt(_M_MMAP_THRESHOLD, 32 << 20)) and bool(mallopt(_M_TRIM_THRESHOLD,
                                                                        1 << 30))
