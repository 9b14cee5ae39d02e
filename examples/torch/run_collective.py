"""Run a cclc-generated NCCL library from PyTorch and check it against the definition.

    cclc compile examples/hgx_node.ccl -o out --only grads --emit nccl --build
    torchrun --nproc-per-node 8 examples/torch/run_collective.py out/nccl-grads [--count N]

Every rank fills a CUDA tensor with small integers (exact in every dtype), runs the cclc
collective through ``cclc.torch``, and compares its output with the collective's definition
computed on the CPU from everyone's inputs; it prints "ok" and the time per call. More ranks
than GPUs share them: each process then sets its own NCCL_HOSTID, which NCCL needs to accept
several ranks on one GPU (they talk over its socket transport).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch
import torch.distributed as dist

from cclc.torch import Communicator, load

_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16,
           "float64": torch.float64, "int32": torch.int32, "int64": torch.int64,
           "int8": torch.int8, "uint8": torch.uint8}


def expected(coll, inputs: list[torch.Tensor], rank: int) -> torch.Tensor | None:
    """What rank ``rank`` must hold, from the definition of the collective (CPU tensors)."""
    n = len(inputs)
    stack = torch.stack(inputs).double()
    reduce = {"sum": lambda t: t.sum(0), "prod": lambda t: t.prod(0),
              "min": lambda t: t.min(0).values, "max": lambda t: t.max(0).values}
    if coll.kind == "allreduce":
        return reduce[coll.op](stack)
    if coll.kind == "reduce":
        return reduce[coll.op](stack) if rank == coll.root else None
    if coll.kind == "reducescatter":
        return reduce[coll.op](stack).chunk(n)[rank]
    if coll.kind == "allgather":
        return stack.flatten()
    if coll.kind == "broadcast":
        return stack[coll.root]
    return torch.cat([x.chunk(n)[rank] for x in stack])     # alltoall


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("library", help="the nccl-<name> folder (or libcclc_<name>.so)")
    parser.add_argument("--count", type=int, default=None,
                        help="elements per call in NCCL's convention (default: 1 Mi elements "
                             "of input)")
    parser.add_argument("--dtype", choices=sorted(_DTYPES), default="float32")
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--inplace", action="store_true")
    args = parser.parse_args()

    local = int(os.environ.get("LOCAL_RANK", "0"))
    devices = torch.cuda.device_count()
    if devices == 0:
        print("no CUDA device", file=sys.stderr)
        return 2
    if int(os.environ.get("LOCAL_WORLD_SIZE", "1")) > devices:
        os.environ["NCCL_HOSTID"] = f"cclc-rank-{os.environ.get('RANK', local)}"
    torch.cuda.set_device(local % devices)
    dist.init_process_group("gloo")          # carries NCCL's unique id and the check's data
    rank, n = dist.get_rank(), dist.get_world_size()
    coll = load(args.library)
    if coll.padded:
        print("a non-uniform alltoall: this example does not build its inputs", file=sys.stderr)
        return 2
    count = args.count or coll.count_of(1 << 20)
    in_elems, out_elems = coll.elements(count)
    dtype = _DTYPES[args.dtype]
    limit = 2 if coll.op == "prod" else max(2, 64 // n)   # every result exact in fp16/bf16
    x_cpu = torch.randint(0, limit, (in_elems,), dtype=torch.int64,
                          generator=torch.Generator().manual_seed(rank)).to(dtype)
    with Communicator() as comm:
        x = x_cpu.cuda()
        if args.inplace:
            # NCCL's in-place layouts: allgather's input is block `rank` of the output
            buf = torch.zeros(max(in_elems, out_elems), dtype=dtype, device="cuda")
            at = rank * in_elems if coll.kind == "allgather" else 0
            buf[at:at + in_elems] = x
            out = buf[rank * out_elems:] if coll.kind == "reducescatter" else buf
            coll(buf[at:at + in_elems], out, comm=comm, count=count)
            y = out[:out_elems]
        else:
            y = coll(x, comm=comm, count=count)[:out_elems]
        torch.cuda.synchronize()
        inputs: list = [None] * n
        dist.all_gather_object(inputs, x_cpu)
        want = expected(coll, inputs, rank)
        wrong = 0 if want is None else int((y.cpu().double() != want).sum())
        start = time.perf_counter()
        for _ in range(args.iters):
            coll(x, comm=comm, count=count)
        torch.cuda.synchronize()
        us = (time.perf_counter() - start) / args.iters * 1e6
    total = torch.tensor([wrong])
    dist.all_reduce(total)
    if rank == 0:
        print(f"{coll.name}: {coll.kind} on {n} ranks, count {count} {args.dtype}"
              f"{' in place' if args.inplace else ''}: {us:.1f} us per call, "
              f"{int(total)} wrong elements: {'ok' if int(total) == 0 else 'FAILED'}")
    dist.destroy_process_group()
    return 0 if int(total) == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
