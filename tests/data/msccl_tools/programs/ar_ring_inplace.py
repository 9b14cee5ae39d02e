"""In-place ring allreduce on 4 ranks in msccl-tools' language (MSCCLang).

Run with msccl-tools installed: ``python ar_ring_inplace.py full`` writes the whole ring;
``drop`` leaves out the last copy of each chunk, so msccl-tools' checker fails it.
"""

import sys

from msccl.language import XML, Buffer, MSCCLProgram, chunk
from msccl.language.collectives import AllReduce
from msccl.topologies import fully_connected

N = 4
with MSCCLProgram("ar_ring_inplace", fully_connected(N), AllReduce(N, N, True), 1,
                  protocol="Simple"):
    for r in range(N):
        for s in range(N - 1):          # reduce chunk r around the ring
            src = (r + s) % N
            chunk((src + 1) % N, Buffer.input, r).reduce(chunk(src, Buffer.input, r))
        holder = (r + N - 1) % N
        for s in range(N - 1 if sys.argv[1] == "full" else N - 2):   # and copy it back around
            chunk((holder + s) % N, Buffer.input, r).copy((holder + s + 1) % N, Buffer.input, r)
    XML()
