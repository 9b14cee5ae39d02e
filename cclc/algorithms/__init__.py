"""The table of algorithms: every way cclc knows to lower a collective into a schedule.

Each entry names the collectives it serves, says whether it applies to a given collective (and
if not, why), and builds the schedule. Modules register their entries at import; the list of
modules imported here is the whole catalogue.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from cclc.collective import Collective, CollectiveKind
from cclc.ir import Schedule
from cclc.relay import lower_relays

__all__ = ["REGISTRY", "Algorithm", "algorithms_for", "get", "register"]


@dataclass(frozen=True, slots=True)
class Algorithm:
    """One lowering.

    ``name`` is what the user writes (``algorithm halfring`` / ``schedule dimrotation``; a
    multi-dimensional torus entry is named ``"<algorithm>+<schedule>"``, e.g.
    ``"halfring+dimrotation"``). ``applicable(coll, **params)`` returns ``None`` when the
    algorithm can serve ``coll`` or a sentence saying why not; ``build(coll, **params)`` returns
    the schedule. ``params`` are the user's hint parameters (e.g. ``chunks=6``).
    """

    name: str
    collectives: frozenset[CollectiveKind]
    applicable: Callable[..., str | None]
    build: Callable[..., Schedule]
    description: str = ""

    @property
    def algorithm(self) -> str:
        return self.name.split("+")[0]

    @property
    def schedule(self) -> str:
        return self.name.split("+")[1] if "+" in self.name else "-"


REGISTRY: dict[str, Algorithm] = {}


def register(algo: Algorithm) -> Algorithm:
    """Add ``algo`` to the table.

    One name may be registered by several modules for disjoint collectives (e.g. ``direct``
    for alltoall in one module and for allgather in another): the entries merge into one that
    dispatches on the collective's kind. A name registered twice for one collective is a bug.

    Every registered build ends with :func:`cclc.relay.lower_relays`: an algorithm may route
    over any healthy path, and the pass turns the moves the topology's declared routing cannot
    carry into relays, so every schedule anyone gets from the table is one the machine runs.
    """
    algo = replace(algo, build=_relayed(algo.build))
    old = REGISTRY.get(algo.name)
    if old is not None:
        if old.collectives & algo.collectives:
            raise ValueError(f"algorithm '{algo.name}' registered twice")
        algo = _merged(old, algo)
    REGISTRY[algo.name] = algo
    return algo


def _relayed(build: Callable[..., Schedule]) -> Callable[..., Schedule]:
    def build_and_relay(coll: Collective, **params) -> Schedule:
        return lower_relays(build(coll, **params))

    return build_and_relay


def _merged(a: Algorithm, b: Algorithm) -> Algorithm:
    def pick(coll: Collective) -> Algorithm:
        return a if coll.kind in a.collectives else b

    return Algorithm(name=a.name, collectives=a.collectives | b.collectives,
                     applicable=lambda coll, **p: pick(coll).applicable(coll, **p),
                     build=lambda coll, **p: pick(coll).build(coll, **p),
                     description="; ".join(d for d in (a.description, b.description) if d))


def algorithms_for(coll: Collective) -> list[Algorithm]:
    """Every registered algorithm that serves ``coll``'s kind, in registration order."""
    _load_all()
    return [a for a in REGISTRY.values() if coll.kind in a.collectives]


def get(name: str) -> Algorithm | None:
    _load_all()
    return REGISTRY.get(name)


def _load_all() -> None:
    # importing a module registers its algorithms; the order here is the order of reports
    import importlib

    for mod in _MODULES:
        importlib.import_module(f"cclc.algorithms.{mod}")


#: algorithm modules, each registers its entries when imported
_MODULES: list[str] = ["direct", "ring", "tree", "torus_collectives", "recursive", "bruck", "pat",
                       "hierarchical", "direct_switch", "torus_multidim",
                       "synth_trees"]
