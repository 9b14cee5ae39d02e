"""NCCL's default for a tuning case: the baseline every tuned entry is compared against.

The choice itself is :func:`cclc.nccl_model.nccl_choice` (the same function compile reports
use); this module only places it in a tuning :class:`~cclc.tuning.space.Space`: the algorithm
and protocol NCCL picks among the space's implementations, NCCL's channels and threads for the
size, and NCCL's chunk snapped to the space's chunk axis.
"""

from __future__ import annotations

from dataclasses import replace

from cclc.nccl_model import NcclModel, nccl_choice, nccl_chunk, nccl_init, nccl_resources
from cclc.tuning.space import Config, Machine, Space, Subspace, max_chunk

__all__ = ["default_point", "machine_model", "nccl_default"]


def machine_model(m: Machine) -> NcclModel:
    """cclc's model of NCCL on ``m``, with ``m.nccl_channels`` as the communicator's count."""
    model = nccl_init(m.nccl_system)
    if model.channels != m.nccl_channels:
        # the user overrode NCCL's channel count (--nccl-channels): NCCL runs that many

        model = replace(model, channels=m.nccl_channels)
    return model


def nccl_default(space: Space, nbytes: int) -> Config:
    """What stock NCCL runs for ``nbytes`` on ``space``'s machine: the argmin of its cost
    model over the space's implementations (default transport), its channels/threads."""
    allowed = {(s.algo, s.proto) for s in space.subspaces if s.transport == "p2p"}
    choice = nccl_choice(machine_model(space.machine), space.func, nbytes, allowed)
    sub = None if choice is None else space.subspace(choice.algo, choice.proto, "p2p")
    if sub is None:
        # a space built by space_for always has Ring; keep NCCL's fallback
        sub = next(s for s in space.subspaces if s.transport == "p2p")
    return default_point(space, sub, nbytes)


def default_point(space: Space, sub: Subspace, nbytes: int) -> Config:
    """NCCL's resources inside the implementation ``sub``: its channel/thread size heuristic
    and its chunk (snapped to the subspace's axes)."""
    m = space.machine
    model = machine_model(m)
    nc, nt = nccl_resources(model, sub.algo, sub.proto, nbytes)
    nc = min(nc, max(sub.channels))
    nt = min(sub.threads, key=lambda v: abs(v - nt))
    chunk = 0
    if sub.chunks != (0,):
        own = nccl_chunk(model, sub.algo, sub.proto, nbytes, nc, space.func,
                         max_chunk(sub.algo, sub.proto))
        chunk = min(sub.chunks, key=lambda v: abs(v - own))
    return Config(sub.algo, sub.proto, sub.transport, nc, nt, chunk)
