"""In-place ring reduce_scatter on 4 ranks in msccl-tools' language (MSCCLang).

Run with msccl-tools installed: ``python rs_ring_inplace.py full`` writes the whole ring;
``drop`` leaves out the last reduction of each chunk, so msccl-tools' checker fails it.
"""

import sys

from msccl.language import XML, Buffer, MSCCLProgram, chunk
from msccl.language.collectives import ReduceScatter
from msccl.topologies import fully_connected

N = 4
with MSCCLProgram("rs_ring_inplace", fully_connected(N), ReduceScatter(N, 1, True), 1,
                  protocol="Simple"):
    for r in range(N):                  # chunk r ends reduced on rank r
        for s in range(N - 1 if sys.argv[1] == "full" else N - 2):
            src = (r + 1 + s) % N
            chunk((src + 1) % N, Buffer.input, r).reduce(chunk(src, Buffer.input, r))
    XML()
