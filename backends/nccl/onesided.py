"""``--emit nccl-onesided``: the NCCL library in its one-sided form (see :mod:`backends.nccl`).

The same dataflow tables as ``--emit nccl``, run on the caller's communicator alone with
NCCL's one-sided API (NCCL 2.29 or later), and its MPI build on MPI's one-sided calls; the
files land in ``nccl-onesided-<name>/``. Its time is the ``nccl-onesided`` execution model's.
"""

from __future__ import annotations

from backends.nccl import ONESIDED

__all__ = ["BACKEND"]

#: the output ``--emit nccl-onesided`` names
BACKEND = ONESIDED
