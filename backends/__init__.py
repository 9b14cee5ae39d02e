"""The backends: one subpackage per output, each a :class:`backends.contract.Backend`.

A backend module exposes ``BACKEND``, an object with ``name``, ``files``, ``render`` and
``build`` (see :mod:`backends.contract`); :func:`load` finds it by the name ``--emit`` takes.
Modules are imported only when asked for, so a missing optional dependency of one backend
costs only that output.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from cclc.errors import CclError

if TYPE_CHECKING:
    from backends.contract import Backend

__all__ = ["BACKENDS", "SCHEDULE_BACKENDS", "load"]

#: output name -> the module whose ``BACKEND`` renders it
BACKENDS: dict[str, str] = {
    "json": "backends.json",
    "msccl": "backends.msccl",
    "mscclpp": "backends.mscclpp",
    "nccl": "backends.nccl",
    "nccl-onesided": "backends.nccl.onesided",
    "html": "backends.html",
    "tuner": "backends.tuner",
}

#: the outputs of a compiled schedule, what ``cclc compile --emit`` offers (the tuner's subject
#: is a table of NCCL parameters, written by ``cclc tune``)
SCHEDULE_BACKENDS: tuple[str, ...] = ("json", "msccl", "mscclpp", "nccl", "nccl-onesided",
                                      "html")


def load(name: str) -> Backend[Any, Any]:
    """The ``BACKEND`` of output ``name``; :class:`CclError` when it cannot be imported."""
    module_name = BACKENDS.get(name)
    if module_name is None:
        raise CclError(f"unknown output '{name}'; known: {', '.join(BACKENDS)}")
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        raise CclError(f"output '{name}' is not available ({module_name} cannot be "
                       f"imported: {err})") from None
    backend = getattr(module, "BACKEND", None)
    if backend is None:
        raise CclError(f"output '{name}' is not available ({module_name} has no BACKEND)")
    return backend
