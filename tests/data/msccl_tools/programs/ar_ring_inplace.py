# in-place ring allreduce written with msccl-tools' language; argv[1] = "full" or "drop"
import sys
from msccl.language import *
from msccl.topologies import fully_connected
from msccl.language.collectives import AllReduce
n = 4
with MSCCLProgram("ar_ring_inplace", fully_connected(n), AllReduce(n, n, True), 1, protocol="Simple"):
    for r in range(n):
        for s in range(n - 1):
            src = (r + s) % n
            chunk((src + 1) % n, Buffer.input, r).reduce(chunk(src, Buffer.input, r))
        h = (r + n - 1) % n
        for s in range(n - 1 if sys.argv[1] == "full" else n - 2):
            chunk((h + s) % n, Buffer.input, r).copy((h + s + 1) % n, Buffer.input, r)
    XML()
