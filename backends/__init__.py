"""The backends: one subpackage per output, each a :class:`backends.contract.Backend`.

A backend module exposes ``BACKEND``, an object with every member of
:class:`backends.contract.Backend` (:data:`MEMBERS`); :func:`load` finds it by the name
``--emit`` takes, and refuses one that lacks a member, naming it.
Modules are imported only when asked for, so a missing optional dependency of one backend
costs only that output.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from cclc.errors import CclError

if TYPE_CHECKING:
    from backends.contract import Backend

__all__ = ["BACKENDS", "MEMBERS", "SCHEDULE_BACKENDS", "load"]

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


#: the members of :class:`backends.contract.Backend`: what the pipeline reads of every backend
MEMBERS = ("name", "wants_simulation", "execution_model", "seconds_per_op", "files", "render",
           "refusal", "build")


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
    missing = [member for member in MEMBERS if not hasattr(backend, member)]
    if missing:
        # a member left out is a backend bug, named here rather than as an AttributeError
        # in the middle of a compile
        raise CclError(f"output '{name}' is not available ({module_name}.BACKEND lacks "
                       f"{', '.join(missing)} of the backend contract, backends/contract.py)")
    return backend
