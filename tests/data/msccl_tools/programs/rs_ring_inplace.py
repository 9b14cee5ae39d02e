# in-place ring reduce_scatter written with msccl-tools' language; argv[1] = "full" or "drop"
import sys
from msccl.language import *
from msccl.topologies import fully_connected
from msccl.language.collectives import ReduceScatter
n = 4
with MSCCLProgram("rs_ring_inplace", fully_connected(n), ReduceScatter(n, 1, True), 1, protocol="Simple"):
    steps = n - 1 if sys.argv[1] == "full" else n - 2
    for r in range(n):            # chunk r ends reduced on rank r
        for s in range(steps):
            src = (r + 1 + s) % n
            dst = (src + 1) % n
            chunk(dst, Buffer.input, r).reduce(chunk(src, Buffer.input, r))
    XML()
