"""Profilers: the model, CSV replay, and the nccl-tests runner with its output parser."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from cclc.errors import SemanticError
from cclc.nccl_model import Algo, Func, Proto, nccl_chunk, nccl_time
from cclc.tuning.baseline import machine_model, nccl_default
from cclc.tuning.profilers import (
    Case,
    CsvProfiler,
    ModelProfiler,
    NcclTestsProfiler,
    nccl_env,
    parse_nccl_tests,
    profiler_from_spec,
)
from cclc.tuning.space import Config, NcclVersion, space_for

V230 = NcclVersion.parse("2.30")
DATA = Path(__file__).parent / "data"

# all_reduce_perf output in nccl-tests' format (src/util.cu writeResultHeader / printing of
# each size; footer "Out of bounds values" / "Avg bus bandwidth"), 8 x H100 in one node
ALL_REDUCE_OUT = (DATA / "all_reduce_perf.txt").read_text()

# all_gather_perf with -c 0 (no check: "#wrong" is N/A), root is -1, redop none
ALL_GATHER_OUT = (DATA / "all_gather_perf_c0.txt").read_text()


def test_parse_all_reduce_rows():
    rows = parse_nccl_tests(ALL_REDUCE_OUT)
    assert [r.size for r in rows] == [8, 1024, 1048576, 1073741824]
    big = rows[-1]
    assert (big.count, big.type, big.redop, big.root) == (268435456, "float", "sum", -1)
    assert big.time_us == pytest.approx(4398.1)
    assert big.algbw == pytest.approx(244.14) and big.busbw == pytest.approx(427.24)
    assert big.in_busbw == pytest.approx(427.88) and big.wrong == "0"
    # busbw = algbw * 2(n-1)/n for n = 8
    assert big.busbw == pytest.approx(big.algbw * 2 * 7 / 8, rel=1e-3)


def test_parse_without_check_and_with_noise():
    rows = parse_nccl_tests(ALL_GATHER_OUT)
    assert [r.size for r in rows] == [33554432, 67108864]
    assert rows[0].wrong == "N/A" and rows[0].busbw == pytest.approx(217.17)


def test_parse_errors():
    with pytest.raises(SemanticError, match="header"):
        parse_nccl_tests("NCCL failure common.cu:1008 'unhandled cuda error'\n")
    header_only = "\n".join(ALL_REDUCE_OUT.splitlines()[:9])
    with pytest.raises(SemanticError, match="no result rows"):
        parse_nccl_tests(header_only)


def test_env_of_a_config():
    env = nccl_env(Config(Algo.RING, Proto.SIMPLE, "shm", 8, 256, 1 << 20))
    assert env["NCCL_ALGO"] == "Ring" and env["NCCL_PROTO"] == "Simple"
    assert env["NCCL_MIN_NCHANNELS"] == env["NCCL_MAX_NCHANNELS"] == "8"
    assert env["NCCL_NTHREADS"] == "256" and env["NCCL_P2P_DISABLE"] == "1"
    # Ring/Simple chunk = buffSize / NCCL_STEPS * 4
    assert int(env["NCCL_BUFFSIZE"]) // 8 * 4 == 1 << 20
    ll128 = nccl_env(Config(Algo.TREE, Proto.LL128, "p2p", 4, 640, 576000))
    assert "NCCL_NTHREADS" not in ll128 and "NCCL_LL128_NTHREADS" not in ll128
    assert "NCCL_P2P_DISABLE" not in ll128 and ll128["NCCL_ALGO"] == "Tree"


def test_nccl_tests_runner_builds_commands_and_parses(hgx_node):
    calls = []

    def runner(argv, env, timeout):
        calls.append((argv, dict(env)))
        # pretend the measured bandwidth grows with the channel count
        bw = 100.0 * int(env["NCCL_MIN_NCHANNELS"])
        return ALL_REDUCE_OUT.replace("427.24", f"{bw:.2f}")

    prof = NcclTestsProfiler("mpirun -np {nranks} ./build/{binary} -b {bytes} -e {bytes} -g 1",
                             runner=runner)
    case = Case(Func.ALLREDUCE, 1073741824, hgx_node)
    got = prof.measure(case, [Config(Algo.RING, Proto.SIMPLE, "p2p", c, 512, 2 << 20)
                              for c in (2, 4)])
    assert got == [pytest.approx(200.0), pytest.approx(400.0)]
    argv, env = calls[0]
    assert argv == ["mpirun", "-np", "8", "./build/all_reduce_perf", "-b", "1073741824", "-e",
                    "1073741824", "-g", "1"]
    assert env["NCCL_ALGO"] == "Ring"
    with pytest.raises(SemanticError, match="placeholders"):
        NcclTestsProfiler("./all_reduce_perf -b 8")
    with pytest.raises(SemanticError, match="placeholder"):
        NcclTestsProfiler("./{binary} -b {bytes} {gpus}", runner=runner).measure(case, [])


def test_nccl_tests_missing_program(hgx_node):
    prof = NcclTestsProfiler("/nonexistent/{binary} -b {bytes}")
    with pytest.raises(SemanticError, match="no such program"):
        prof.measure(Case(Func.ALLREDUCE, 1024, hgx_node),
                     [Config(Algo.RING, Proto.LL, "p2p", 1, 64, 32768)])


def test_csv_replay(tmp_path, hgx_node):
    path = tmp_path / "m.csv"
    path.write_text("# measured on box\n"
                    "collective,nbytes,algorithm,protocol,channels,threads,busbw\n"
                    "allreduce,1048576,ring,simple,4,,120.5\n"
                    "AllReduce,1048576,NVLS,Simple,8,640,300\n")
    prof = CsvProfiler(str(path))
    case = Case(Func.ALLREDUCE, 1048576, hgx_node)
    got = prof.measure(case, [Config(Algo.RING, Proto.SIMPLE, "p2p", 4, 96, 1 << 20),
                              Config(Algo.NVLS, Proto.SIMPLE, "p2p", 8, 640, 1 << 19),
                              Config(Algo.NVLS, Proto.SIMPLE, "p2p", 8, 512, 1 << 19),
                              Config(Algo.RING, Proto.LL, "p2p", 4, 96, 1 << 20)])
    assert got == [120.5, 300.0, None, None]
    assert prof.identity() != CsvProfiler.__name__
    bad = tmp_path / "bad.csv"
    bad.write_text("collective,nbytes,algorithm,protocol,channels,busbw\n"
                   "allreduce,1,warp,simple,1,1\n")
    with pytest.raises(SemanticError, match="bad.csv:2: unknown algorithm 'warp'"):
        CsvProfiler(str(bad))
    with pytest.raises(SemanticError, match="lacks the column"):
        (tmp_path / "c.csv").write_text("collective,nbytes\nallreduce,1\n")
        CsvProfiler(str(tmp_path / "c.csv"))


def test_profiler_specs(tmp_path):
    assert isinstance(profiler_from_spec("model"), ModelProfiler)
    assert isinstance(profiler_from_spec("nccl-tests:./{binary} -b {bytes}"), NcclTestsProfiler)
    with pytest.raises(SemanticError, match="unknown profiler"):
        profiler_from_spec("oracle")


def test_model_is_physical(hgx_node, hgx_cluster):
    prof = ModelProfiler()
    space = space_for(Func.ALLREDUCE, hgx_node, V230)
    big = Case(Func.ALLREDUCE, 1 << 30, hgx_node)
    best = max(v for v in prof.measure(big, list(space.configs())) if v is not None)
    # NVLink 450 GB/s per direction: busbw can exceed it only through NVLS in-switch reduction
    assert 300 < best < 2 * 450
    # more NICs never make the model slower
    case = Case(Func.ALLREDUCE, 1 << 26, hgx_cluster)
    c = Config(Algo.RING, Proto.SIMPLE, "p2p", 8, 512, 1 << 20)
    from dataclasses import replace
    fewer = replace(hgx_cluster, system=replace(hgx_cluster.system, nics=4))
    assert prof.measure(case, [c])[0] > prof.measure(Case(Func.ALLREDUCE, 1 << 26, fewer), [c])[0]
    # small messages are latency bound: LL beats Simple at 4 KiB on the same ring
    tiny = Case(Func.ALLREDUCE, 4096, hgx_cluster)
    ll, simple = prof.measure(tiny, [Config(Algo.RING, Proto.LL, "p2p", 4, 256, 32768),
                                     Config(Algo.RING, Proto.SIMPLE, "p2p", 4, 256, 1 << 20)])
    assert ll > simple


def test_model_channels_unimodal(hgx_cluster):
    """AutoCCL's premise, which the model must keep: busbw rises then falls along channels."""
    prof = ModelProfiler()
    for nbytes in (1 << 16, 1 << 22, 1 << 28):
        case = Case(Func.ALLREDUCE, nbytes, hgx_cluster)
        nc = np.arange(1, 65, dtype=float)
        bw = prof.busbw_array(case, Algo.RING, Proto.SIMPLE, "p2p", nc, np.full(64, 512.0),
                              np.full(64, float(1 << 20)))
        peak = int(np.argmax(bw))
        assert np.all(np.diff(bw[:peak + 1]) >= -1e-9)
        assert np.all(np.diff(bw[peak:]) <= 1e-9)


def test_nccl_default_choice(hgx_node, hgx_cluster, single_gpu_fabric):
    space = space_for(Func.ALLREDUCE, hgx_node, V230)
    d_small, d_big = nccl_default(space, 1024), nccl_default(space, 1 << 30)
    # one H100 node: NVLink SHARP wins at 1 GiB on its own channel set; small calls drop
    # channels below the ring count NCCL sets up (24 on 18 NVLinks)
    assert (d_big.algo, d_big.channels) == (Algo.NVLS, 16)
    assert d_small.channels < hgx_node.nccl_channels == 24
    ag = nccl_default(space_for(Func.ALLGATHER, hgx_node, V230), 1 << 30)
    assert (ag.algo, ag.channels) == (Algo.RING, 24)
    # NCCL's estimate is what the default minimizes
    model = machine_model(hgx_node)
    t = {(s.algo, s.proto): nccl_time(model, Func.ALLREDUCE, s.algo, s.proto, 1 << 30)
         for s in space.subspaces}
    assert (d_big.algo, d_big.proto) == min(t, key=lambda k: t[k])
    ag = space_for(Func.ALLGATHER, single_gpu_fabric, V230)
    assert nccl_default(ag, 1 << 28).algo in (Algo.PAT, Algo.RING)


def test_nccl_chunk_rules(hgx_cluster, single_gpu_fabric):
    from cclc.tuning.space import max_chunk
    top = max_chunk(Algo.PAT, Proto.SIMPLE)
    one, hgx = machine_model(single_gpu_fabric), machine_model(hgx_cluster)

    def chunk(model, algo, nbytes, nc, func=Func.ALLREDUCE):
        return nccl_chunk(model, algo, Proto.SIMPLE, nbytes, nc, func,
                          max_chunk(algo, Proto.SIMPLE))
    # PAT AllGather halves while chunk * nCh * 32 > nBytes, never below 64 KiB (§5)
    assert chunk(one, Algo.PAT, 1 << 40, 4, Func.ALLGATHER) == top
    c = chunk(one, Algo.PAT, 1 << 22, 4, Func.ALLGATHER)
    assert c * 4 * 32 <= 1 << 22 or c == 65536
    assert chunk(one, Algo.PAT, 1024, 4, Func.ALLGATHER) == 65536
    # a deep tree on a small buffer gets smaller chunks; ring keeps the protocol default
    assert chunk(hgx, Algo.TREE, 1 << 20, 16) < max_chunk(Algo.TREE, Proto.SIMPLE)
    assert chunk(hgx, Algo.RING, 1 << 20, 16) == max_chunk(Algo.RING, Proto.SIMPLE)
