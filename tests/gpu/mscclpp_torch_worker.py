"""One rank of tests/gpu/test_mscclpp_nccl_on_gpu.py, run by torchrun under MSCCL++'s NCCL
interface (``LD_PRELOAD`` of ``libmscclpp_nccl.so``): it registers the plans of one buffer mode
with ``cclc.torch.register_mscclpp``, then calls plain ``torch.distributed`` collectives sized
inside each plan's window and counts the elements that differ from the collective's definition.

usage: mscclpp_torch_worker.py FOLDER in|out

Each rank prints ``plan NAME: N bytes, W wrong elements``; MSCCL++'s own log (EXEC, on
stdout) says which plan its executor ran. Ranks share GPU 0; the NCCL that MSCCL++ hands
other calls to (``MSCCLPP_NCCL_LIB_PATH``) is told each rank is its own host.
"""

from __future__ import annotations

import os
import sys

import torch
import torch.distributed as dist

from cclc.torch import MscclppPlan, register_mscclpp


def values(rank: int, n: int) -> torch.Tensor:
    """Rank ``rank``'s input: small integers, so every sum is exact in fp32."""
    return (torch.arange(n, device="cuda") % 13 + rank + 1).to(torch.float32)


def run(plan: MscclppPlan, rank: int, world: int) -> tuple[int, int]:
    """Call ``plan``'s collective at a size it serves; (bytes, wrong elements)."""
    units = max(4, -(-plan.min_bytes // plan.granularity))
    nbytes = units * plan.granularity
    assert plan.serves(plan.collective, nbytes, plan.inplace), (plan, nbytes)
    n = nbytes // 4   # input elements; the gathered output's for allgather
    if plan.collective == "allreduce":
        x = values(rank, n)
        dist.all_reduce(x)   # in place
        want = sum(values(r, n) for r in range(world))
        got = x
    elif plan.collective == "allgather":
        m = n // world
        got = torch.zeros(n, device="cuda")
        mine = got[rank * m:(rank + 1) * m] if plan.inplace else torch.empty(m, device="cuda")
        mine.copy_(values(rank, m))
        dist.all_gather_into_tensor(got, mine)
        want = torch.cat([values(r, m) for r in range(world)])
    elif plan.collective == "reducescatter":
        m = n // world
        full = values(rank, n)
        got = full[rank * m:(rank + 1) * m] if plan.inplace else torch.empty(m, device="cuda")
        dist.reduce_scatter_tensor(got, full)
        want = sum(values(r, n) for r in range(world))[rank * m:(rank + 1) * m]
    else:
        raise ValueError(f"torch.distributed has no call for plan {plan.name}")
    torch.cuda.synchronize()
    return nbytes, int((got != want).sum().item())


def main() -> int:
    folder, mode = sys.argv[1], sys.argv[2]
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    os.environ["NCCL_HOSTID"] = f"cclc-mscclpp-{rank}"
    torch.cuda.set_device(0)
    plans = register_mscclpp(folder, inplace=mode == "in")
    dist.init_process_group(backend="nccl", device_id=torch.device("cuda", 0))
    wrong = 0
    for plan in plans:
        if plan.collective == "allreduce" and not plan.inplace:
            continue   # torch.distributed's all_reduce is in place only
        nbytes, bad = run(plan, rank, world)
        wrong += bad
        print(f"rank {rank} plan {plan.name}: {nbytes} bytes, {bad} wrong elements", flush=True)
    dist.barrier()
    dist.destroy_process_group()
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
