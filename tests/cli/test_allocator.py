"""The allocator settings of :mod:`cclc.allocator`: the ``cclc`` program serves large arrays
from glibc's heap and never gives its top back (freed memory is reused, not faulted in again);
a caller of :func:`cclc.cli.main` in its own process keeps its allocator as it was."""

from __future__ import annotations

import ctypes
import ctypes.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _glibc_mallinfo2() -> bool:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return hasattr(libc, "mallinfo2") and hasattr(libc, "mallopt")
    except OSError:
        return False


pytestmark = pytest.mark.skipif(not _glibc_mallinfo2(), reason="needs glibc 2.33+ (mallinfo2)")

#: run in a fresh interpreter: cli.main(ARGS) (Python text), then a 400 MB array; prints the
#: bytes glibc then holds in mmap'ed blocks (mallinfo2's hblkhd), then the heap's bytes
#: (arena) after a 1.2 GB block at its top is freed (allocated only: no page is touched)
PROBE = """
import ctypes, ctypes.util, sys
import numpy as np
from cclc import cli

class Info(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
        "fordblks", "keepcost")]

libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
libc.mallinfo2.restype = Info
code = cli.main(ARGS)
a = np.ones(50_000_000)
mmapped = libc.mallinfo2().hblkhd
b = np.empty(150_000_000)
del b
print(code, mmapped, libc.mallinfo2().arena)
"""


def _probe(tmp_path: Path, args: str) -> tuple[int, int, int]:
    source = tmp_path / "t.ccl"
    source.write_text("topology t = torus(3, 3) { link 32 GB/s, 100 ns }\n")
    script = PROBE.replace("ARGS", args.replace("FILE", repr(str(source))))
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True,
                          text=True, check=True)
    code, mmapped, heap = done.stdout.split()[-3:]
    return int(code), int(mmapped), int(heap)


def test_the_program_serves_large_arrays_from_the_heap(tmp_path):
    code, mmapped, heap = _probe(tmp_path, "['check', FILE], own_process=True")
    assert code == 0
    assert mmapped < 50_000_000          # the 400 MB array is in the heap, not mmap'ed
    # the freed 1.2 GB top stays for the next array (1 GiB of top kept, as before, gave it
    # back: the AllToAll's gigabyte temporaries faulted their pages in again)
    assert heap >= 1_600_000_000


def test_a_caller_of_main_keeps_its_allocator(tmp_path):
    code, mmapped, _ = _probe(tmp_path, "['check', FILE]")
    assert code == 0
    assert mmapped >= 400_000_000        # glibc's default: a block this large is mmap'ed
