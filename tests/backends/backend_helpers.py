"""Schedules, topologies and runners shared by the backend tests."""

from __future__ import annotations

import os
import pathlib
import shutil
import subprocess

import numpy as np
import sim_builders

from cclc.collective import CollectiveKind, DType, ReduceOp, make_collective
from cclc.ir import Buf, OpKind, Schedule, ScheduleBuilder
from cclc.topology import NodeType, single_node, single_switch, torus, with_faults

GOLDEN = pathlib.Path(__file__).parent / "golden"


def nvcc_build_unavailable() -> str | None:
    """Why an nvcc build of the NCCL library cannot run here, or ``None`` when it can.

    The build needs nvcc and NCCL's headers (the ``nvidia-nccl-cu13`` wheel of
    ``pip install -e '.[nccl]'``, or ``NCCL_HOME``); a machine with only one of them skips.
    """
    from backends.nccl.build import BuildError, nccl_home

    if shutil.which("nvcc") is None:
        return "nvcc (CUDA toolkit) is not installed"
    try:
        nccl_home()
    except BuildError as err:
        return err.message
    return None


NVCC_BUILD_UNAVAILABLE = nvcc_build_unavailable()
REGEN = os.environ.get("CCLC_REGEN") == "1"


def check_golden(name: str, text: str) -> None:
    """Compare ``text`` with golden file ``name`` (rewrite it when CCLC_REGEN=1)."""
    path = GOLDEN / name
    if REGEN:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        return
    assert path.exists(), f"missing golden file {path}; run with CCLC_REGEN=1 to create it"
    assert text == path.read_text(), f"{name} differs from its golden file (CCLC_REGEN=1 rewrites)"


def _ring_route(b: ScheduleBuilder, topo, u: int, v: int) -> int:
    return b.route(topo.shortest_path_links(u, v))


def ring_allgather(n: int = 4, elems: int = 4, name: str = "ag-ring") -> Schedule:
    """Hand-built ring allgather: copy own block, then forward n-1 times."""
    topo = torus("ring", (n,))
    coll = make_collective(name, CollectiveKind.ALLGATHER, topo, tuple(range(n)),
                           n * elems * 4)
    b = ScheduleBuilder(coll, input=[elems], output=[elems] * n)
    for r in range(n):
        nxt = (r + 1) % n
        b.add(step=0, src=r, dst=r, src_buf=Buf.INPUT, src_off=0, dst_buf=Buf.OUTPUT, dst_off=r)
        b.add(step=0, src=r, dst=nxt, route=_ring_route(b, topo, r, nxt), src_buf=Buf.INPUT,
              src_off=0, dst_buf=Buf.OUTPUT, dst_off=r)
        for t in range(1, n - 1):
            c = (r - t) % n
            b.add(step=t, src=r, dst=nxt, route=_ring_route(b, topo, r, nxt),
                  src_buf=Buf.OUTPUT, src_off=c, dst_buf=Buf.OUTPUT, dst_off=c)
    return b.build("ring")


def ring_reducescatter(n: int = 3, elems: int = 2, name: str = "rs-ring",
                       op: ReduceOp = ReduceOp.SUM, dtype: DType = DType.FP32) -> Schedule:
    """Hand-built ring reduce-scatter through scratch: partial sums travel and grow."""
    topo = torus("ring", (n,))
    coll = make_collective(name, CollectiveKind.REDUCESCATTER, topo, tuple(range(n)),
                           n * elems * dtype.itemsize, dtype=dtype, op=op)
    b = ScheduleBuilder(coll, input=[elems] * n, output=[elems], scratch=[elems] * n)
    for r in range(n):
        nxt = (r + 1) % n
        b.add(step=0, src=r, dst=r, src_buf=Buf.INPUT, src_off=0, dst_buf=Buf.SCRATCH,
              dst_off=0, count=n)
        for t in range(n - 1):
            c = (r - t - 1) % n
            b.add(step=t + 1, src=r, dst=nxt, route=_ring_route(b, topo, r, nxt),
                  kind=OpKind.REDUCE, src_buf=Buf.SCRATCH, src_off=c, dst_buf=Buf.SCRATCH,
                  dst_off=c)
        b.add(step=n, src=r, dst=r, src_buf=Buf.SCRATCH, src_off=r, dst_buf=Buf.OUTPUT,
              dst_off=0)
    return b.build("ring")


def folded_reducescatter(n: int = 3, elems: int = 2, name: str = "rs-folded") -> Schedule:
    """``sim_builders.folded_reducescatter`` in one server of ``n`` GPUs, ``elems`` float32
    elements per block: ``n`` steps of local ops alone, the receive slot reused from one peer
    step to the next."""
    topo = single_node("box", NodeType(f"box{n}", "nvswitch", n, 450e9, 1e-6))
    return sim_builders.folded_reducescatter(topo, n * elems * 4, DType.FP32, name)


def pairwise_alltoall(n: int = 3, elems: int = 2, name: str = "a2a") -> Schedule:
    """Hand-built alltoall: local block, then in step k rank r sends its block to r+k."""
    topo = torus("ring", (n,))
    coll = make_collective(name, CollectiveKind.ALLTOALL, topo, tuple(range(n)),
                           n * elems * 4)
    b = ScheduleBuilder(coll, input=[elems] * n, output=[elems] * n)
    for r in range(n):
        b.add(step=0, src=r, dst=r, src_buf=Buf.INPUT, src_off=r, dst_buf=Buf.OUTPUT, dst_off=r)
        for k in range(1, n):
            d = (r + k) % n
            b.add(step=k - 1, src=r, dst=d, route=_ring_route(b, topo, r, d),
                  src_buf=Buf.INPUT, src_off=d, dst_buf=Buf.OUTPUT, dst_off=r)
    return b.build("pairwise")


def swap_allreduce(name: str = "ar-swap") -> Schedule:
    """Two ranks exchange and reduce the same slots in one step, in place in their input:
    exercises staging (C++), input relocation (MSCCL) and a same-step read/write."""
    topo = torus("pair", (2,))
    coll = make_collective(name, CollectiveKind.ALLREDUCE, topo, (0, 1), 16)
    b = ScheduleBuilder(coll, input=[2, 2], output=[2, 2])
    for r in range(2):
        o = 1 - r
        b.add(step=0, src=r, dst=o, route=_ring_route(b, topo, r, o), kind=OpKind.REDUCE,
              src_buf=Buf.INPUT, src_off=0, dst_buf=Buf.INPUT, dst_off=0, count=2)
        # reads what the step also writes: the old value is what must be copied and sent
        b.add(step=0, src=r, dst=r, src_buf=Buf.INPUT, src_off=0, dst_buf=Buf.OUTPUT,
              dst_off=0)
        b.add(step=1, src=r, dst=r, src_buf=Buf.INPUT, src_off=1, dst_buf=Buf.OUTPUT,
              dst_off=1)
        b.add(step=2, src=r, dst=r, src_buf=Buf.INPUT, src_off=0, dst_buf=Buf.OUTPUT,
              dst_off=0)
    return b.build("swap")


def swap_alltoall(name: str = "a2a-swap") -> Schedule:
    """Two ranks send a slot and receive (copy) into that same slot in one step: the send must
    read the old value even though the receive lands in place."""
    topo = torus("pair", (2,))
    coll = make_collective(name, CollectiveKind.ALLTOALL, topo, (0, 1), 2 * 3 * 4)
    b = ScheduleBuilder(coll, input=[3, 3], output=[3, 3])
    for r in range(2):
        o = 1 - r
        b.add(step=0, src=r, dst=o, route=_ring_route(b, topo, r, o), src_buf=Buf.INPUT,
              src_off=o, dst_buf=Buf.INPUT, dst_off=r)
        b.add(step=0, src=r, dst=r, src_buf=Buf.INPUT, src_off=r, dst_buf=Buf.OUTPUT,
              dst_off=r)
        b.add(step=1, src=r, dst=r, src_buf=Buf.INPUT, src_off=o, dst_buf=Buf.OUTPUT,
              dst_off=o)
    return b.build("swap")


# -- registry schedules ------------------------------------------------------------------------

def pick(coll, names: list[str]):
    """The first applicable registered algorithm among ``names`` (and its name)."""
    from cclc.algorithms import get

    reasons = []
    for name in names:
        algo = get(name)
        if algo is None:
            reasons.append(f"{name}: not registered")
            continue
        why = algo.applicable(coll)
        if why is None:
            return name, algo.build(coll)
        reasons.append(f"{name}: {why}")
    raise AssertionError("no algorithm applies: " + "; ".join(reasons))


def torus333_faulty():
    t = torus("t333", (3, 3, 3))
    a, b = t.rank_at((0, 0, 0)), t.rank_at((1, 0, 0))
    return with_faults(t, links=[(a, b), (b, a)])


def fabric_2x3():
    node = NodeType("hgx3", "nvswitch", 3, 450e9, 1e-6, nics=3, nic_bandwidth=50e9)
    return single_switch("two", 2, node, 50e9, 2e-6)


# -- running the MPI build -----------------------------------------------------------------------

MPIRUN = shutil.which("mpirun")
NP_TYPES = {DType.FP32: (np.float32, 7), DType.INT32: (np.int32, 2), DType.FP64: (np.float64, 8),
            DType.INT64: (np.int64, 4), DType.UINT8: (np.uint8, 1), DType.FP16: (np.float16, 6),
            DType.BF16: (np.float32, 9)}   # bf16: computed in float32, stored as its top half


def _to_file_type(x: np.ndarray, dtype: DType) -> np.ndarray:
    # the small integers used here are exact in bf16, so truncating float32 is exact
    return (x.view(np.uint32) >> 16).astype(np.uint16) if dtype is DType.BF16 else x
_OPS = {ReduceOp.SUM: np.add, ReduceOp.PROD: np.multiply, ReduceOp.MIN: np.minimum,
        ReduceOp.MAX: np.maximum}



def write_exact_inputs(coll, dtype: DType, in_elems: int, seed: int,
                       data: pathlib.Path) -> list[np.ndarray]:
    """Random inputs of every rank written as ``data/in.<rank>.bin``: small integers, so every
    order of reduction gives the same exact result (fp16/bf16 sums stay exact in 8 mantissa
    bits)."""
    np_type = NP_TYPES[dtype][0]
    rng = np.random.default_rng(seed)
    data.mkdir(exist_ok=True)
    inputs = []
    for r in range(coll.n):
        lo, hi = (1, 3) if coll.op is ReduceOp.PROD else (-50, 50)
        if np_type is np.uint8:
            lo, hi = 0, 4
        if dtype in (DType.FP16, DType.BF16):
            lo, hi = (1, 3) if coll.op is ReduceOp.PROD else (-8, 8)
        x = rng.integers(lo, hi, size=in_elems).astype(np_type)
        _to_file_type(x, dtype).tofile(data / f"in.{r}.bin")
        inputs.append(x)
    return inputs


def check_outputs(coll, dtype: DType, inputs: list[np.ndarray], data: pathlib.Path) -> None:
    """Every rank's ``data/out.<rank>.bin`` equals numpy's reference of the collective."""
    np_type = NP_TYPES[dtype][0]
    want = reference(coll.kind, coll.op, inputs, coll.root)
    for r in range(coll.n):
        if want[r] is None:
            continue
        expect = _to_file_type(np.asarray(want[r], dtype=np_type), dtype)
        got = np.fromfile(data / f"out.{r}.bin", dtype=expect.dtype)
        assert got.shape == expect.shape, f"rank {r}: {got.shape} vs {expect.shape}"
        bad = np.flatnonzero(got != expect)
        assert not len(bad), (f"rank {r}: {len(bad)} wrong elements, first at {bad[0]}: "
                              f"{got[bad[0]]} != {expect[bad[0]]}")

def reference(kind: CollectiveKind, op: ReduceOp, inputs: list[np.ndarray], root: int | None):
    """Every rank's expected output, straight from the collective's definition (numpy)."""
    n = len(inputs)
    red = _OPS[op]
    if kind is CollectiveKind.ALLGATHER:
        return [np.concatenate(inputs)] * n
    if kind is CollectiveKind.ALLTOALL:
        b = len(inputs[0]) // n
        return [np.concatenate([x[j * b:(j + 1) * b] for x in inputs]) for j in range(n)]
    if kind is CollectiveKind.REDUCESCATTER:
        b = len(inputs[0]) // n
        return [red.reduce([x[r * b:(r + 1) * b] for x in inputs]) for r in range(n)]
    if kind is CollectiveKind.ALLREDUCE:
        return [red.reduce(inputs)] * n
    if kind is CollectiveKind.BROADCAST:
        return [inputs[root]] * n
    if kind is CollectiveKind.REDUCE:         # only the root's output is specified
        return [red.reduce(inputs) if r == root else None for r in range(n)]
    raise AssertionError(f"no reference for {kind}")


def run_mpi(schedule: Schedule, workdir: pathlib.Path, scale: int = 1, inplace: bool = False,
            seed: int = 0, dtype: DType | None = None, count: int | None = None,
            api: str = "lanes") -> None:
    """Emit + build the MPI driver (of the library's form ``api``), run it on ``n`` processes
    with random inputs of ``scale`` times the compiled count, or of ``count`` (in ``dtype``,
    default the collective's), and assert every output buffer equals the numpy reference."""
    from backends.common import EmitOptions, entry_count
    from backends.nccl import emit
    from backends.units import buffer_units, to_units

    coll = schedule.collective
    files = emit(schedule, workdir, EmitOptions(mpi=True), api=api)
    exe = files[-1]
    units, us = to_units(schedule, split=True)
    widths = buffer_units(units)
    if count is None:
        count = (us.count_units * us.unit if us.exact else entry_count(schedule)) * scale
    # the input is whole blocks of ``count`` elements (the near-equal form) or whole units
    in_elems = (widths[Buf.INPUT] // us.count_units * count if us.split
                else widths[Buf.INPUT] * (count // us.count_units))
    dtype = dtype or coll.dtype
    code = NP_TYPES[dtype][1]
    data = workdir / "data"
    inputs = write_exact_inputs(coll, dtype, in_elems, seed, data)
    cmd = [MPIRUN, "--allow-run-as-root", "--oversubscribe", "-np", str(coll.n), str(exe),
           str(data), str(count), str(code)] + (["inplace"] if inplace else [])
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, f"mpirun failed:\n{proc.stdout}\n{proc.stderr}"
    check_outputs(coll, dtype, inputs, data)


# -- random schedules ------------------------------------------------------------------------------

def random_allgather(n: int, seed: int, elems: int = 2) -> Schedule:
    """A random gossip allgather: each step, random holders forward blocks to random ranks that
    lack them (through any pair: the code backends do not care about links)."""
    rng = np.random.default_rng(seed)
    topo = torus("ring", (n,))
    coll = make_collective(f"ag-rand-{seed}", CollectiveKind.ALLGATHER, topo, tuple(range(n)),
                           n * elems * 4)
    b = ScheduleBuilder(coll, input=[elems], output=[elems] * n)
    known = [{r} for r in range(n)]
    step = 0
    for r in range(n):
        b.add(step=0, src=r, dst=r, src_buf=Buf.INPUT, src_off=0, dst_buf=Buf.OUTPUT,
              dst_off=r)
    while any(len(k) < n for k in known):
        new = [set() for _ in range(n)]
        for _ in range(int(rng.integers(1, 2 * n))):
            src = int(rng.integers(n))
            dst = int(rng.integers(n))
            blocks = sorted(known[src] - known[dst] - new[dst])
            if src == dst or not blocks:
                continue
            blk = int(rng.choice(blocks))
            # at step 0 a rank's own block is read from its input; later from its output
            from_input = blk == src and step == 0
            b.add(step=step, src=src, dst=dst, route=b.route(topo.shortest_path_links(src, dst)),
                  src_buf=Buf.INPUT if from_input else Buf.OUTPUT,
                  src_off=0 if from_input else blk, dst_buf=Buf.OUTPUT, dst_off=blk)
            new[dst].add(blk)
        for r in range(n):
            known[r] |= new[r]
        step += 1
    return b.build("random")


def random_reducescatter(n: int, seed: int, elems: int = 2,
                         op: ReduceOp = ReduceOp.SUM) -> Schedule:
    """A random reduction tree per block: partial sums in scratch travel between random ranks
    and are added where they land; the owner finally copies its block out."""
    rng = np.random.default_rng(seed)
    topo = torus("ring", (n,))
    coll = make_collective(f"rs-rand-{seed}", CollectiveKind.REDUCESCATTER, topo,
                           tuple(range(n)), n * elems * 4, op=op)
    b = ScheduleBuilder(coll, input=[elems] * n, output=[elems], scratch=[elems] * n)
    for r in range(n):
        b.add(step=0, src=r, dst=r, src_buf=Buf.INPUT, src_off=0, dst_buf=Buf.SCRATCH,
              dst_off=0, count=n)
    active = [set(range(n)) for _ in range(n)]       # active[c]: ranks holding a partial of c
    step = 1
    while any(len(a) > 1 for a in active):
        for c in range(n):
            busy: set[int] = set()
            for _ in range(int(rng.integers(1, n + 1))):
                senders = sorted(active[c] - {c} - busy)
                if not senders:
                    break
                src = int(rng.choice(senders))
                targets = sorted(active[c] - {src} - busy)
                if not targets:
                    break
                dst = int(rng.choice(targets))
                b.add(step=step, src=src, dst=dst,
                      route=b.route(topo.shortest_path_links(src, dst)), kind=OpKind.REDUCE,
                      src_buf=Buf.SCRATCH, src_off=c, dst_buf=Buf.SCRATCH, dst_off=c)
                busy |= {src, dst}
                active[c].discard(src)
        step += 1
    for r in range(n):
        b.add(step=step, src=r, dst=r, src_buf=Buf.SCRATCH, src_off=r, dst_buf=Buf.OUTPUT,
              dst_off=0)
    return b.build("random")


def uneven_ring_allgather(n: int = 3, elems: int = 100_000, pieces: int = 3,
                          name: str = "ag-uneven", floor: bool = False,
                          cut: list[int] | None = None) -> Schedule:
    """Ring allgather whose blocks are cut like ``numpy.array_split`` (or at ``floor(i * elems
    / pieces)``, or as ``cut`` says) into ``pieces`` unequal chunks (``elems`` not a multiple
    of ``pieces``): exact units are single elements, far more than MSCCL can address, so
    MSCCL needs the near-equal form."""
    if cut is None and floor:
        cut = np.diff(np.arange(pieces + 1) * elems // pieces).tolist()
    elif cut is None:
        cut = [len(a) for a in np.array_split(np.arange(elems), pieces)]
    elems, pieces = sum(cut), len(cut)
    topo = torus("ring", (n,))
    coll = make_collective(name, CollectiveKind.ALLGATHER, topo, tuple(range(n)),
                           n * elems * 4)
    b = ScheduleBuilder(coll, input=cut, output=cut * n)
    for r in range(n):
        nxt = (r + 1) % n
        for p in range(pieces):
            b.add(step=0, src=r, dst=r, src_buf=Buf.INPUT, src_off=p, dst_buf=Buf.OUTPUT,
                  dst_off=r * pieces + p)
            b.add(step=0, src=r, dst=nxt, route=_ring_route(b, topo, r, nxt),
                  src_buf=Buf.INPUT, src_off=p, dst_buf=Buf.OUTPUT, dst_off=r * pieces + p)
            for t in range(1, n - 1):
                c = ((r - t) % n) * pieces + p
                b.add(step=t, src=r, dst=nxt, route=_ring_route(b, topo, r, nxt),
                      src_buf=Buf.OUTPUT, src_off=c, dst_buf=Buf.OUTPUT, dst_off=c)
    return b.build("ring")
