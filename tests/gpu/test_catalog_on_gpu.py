"""The fault catalog's NCCL library on a real GPU: one library for a 3x3 torus holds a schedule
per orbit of single failed links; each process (a rank, all on GPU 0) starts under
``CCLC_FAULTS`` (the healthy machine, a member of the orbit, another member named by its
other direction), the library selects and relabels that member's schedule at its first call,
and every output buffer must equal numpy's. A fault set outside the catalog fails every call
with ``ncclInvalidArgument``."""

from __future__ import annotations

import pytest
from backend_helpers import check_outputs
from gpu_helpers import build_harness, run_harness

from backends.common import EmitOptions, entry_count
from backends.nccl.catalog import write_catalog_library
from cclc.catalog.build import build_catalog
from cclc.collective import CollectiveKind, make_collective
from cclc.outdir import OutputDir
from cclc.topology import torus


@pytest.fixture(scope="module", params=[CollectiveKind.ALLGATHER, CollectiveKind.REDUCESCATTER],
                ids=["allgather", "reducescatter"])
def built(request, tmp_path_factory):
    t = torus("t", (3, 3))
    coll = make_collective("cat", request.param, t, tuple(range(t.n_ranks)),
                           size=t.n_ranks * 32 * 4)
    catalog = build_catalog(coll, ("link",))
    folder = tmp_path_factory.mktemp("catalog")
    with OutputDir(folder) as out:
        write_catalog_library(catalog, out, EmitOptions(build=True))
    lib = folder / "nccl-cat"
    return catalog, lib, build_harness(lib)


def _run(built, tmp_path, faults: str) -> list[tuple[int, str, str]]:
    catalog, _, exe = built
    coll = catalog.collective
    count = entry_count(catalog.schedules[0].plan.schedule)
    in_elems = count * (coll.n if coll.kind is CollectiveKind.REDUCESCATTER else 1)
    out_elems = count * (coll.n if coll.kind is CollectiveKind.ALLGATHER else 1)
    results, inputs, data = run_harness(exe, coll, coll.dtype, count, in_elems, out_elems,
                                        tmp_path, seed=3, CCLC_FAULTS=faults)
    if all(status == 0 for status, _, _ in results):
        check_outputs(coll, coll.dtype, inputs, data)
    return results


def test_each_fault_set_runs_its_relabeled_schedule(built, tmp_path):
    catalog = built[0]
    members = catalog.classes[0].members
    first, last = members[0].faults.links, members[-1].faults.links
    for faults in ("", ",".join(map(str, first)), str(last[-1])):
        for r, (status, out, err) in enumerate(_run(built, tmp_path / f"f{faults}", faults)):
            assert status == 0, f"CCLC_FAULTS={faults!r}: rank {r} exited {status}:\n{out}\n{err}"


def test_a_fault_set_outside_the_catalog_fails_the_call(built, tmp_path):
    members = built[0].classes[0].members
    faults = f"{members[0].faults.links[0]},{members[1].faults.links[0]}"
    results = _run(built, tmp_path, faults)
    assert all(status != 0 for status, _, _ in results)
    assert all("invalid argument" in err for _, _, err in results), results[0]
