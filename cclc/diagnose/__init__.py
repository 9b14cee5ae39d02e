"""Fault diagnosis from measured per-pair timings (C4D-style): read timings, map each pair onto
the links its traffic crosses, find the link, NIC, switch or GPU that explains the slow pairs,
and write ``fault`` statements that the next ``cclc compile`` routes around.

The parts, in the order :func:`cclc.commands.diagnose.run` uses them:

* :mod:`cclc.diagnose.pair_timings` — the measured data (:class:`Timings`);
* :mod:`cclc.diagnose.timings` — read a timings file (any format) into it;
* :mod:`cclc.diagnose.nccl_tests` — nccl-tests ``sendrecv_perf`` logs, placed on the topology;
* :mod:`cclc.diagnose.routes` — which links each pair crosses (the topology's routing);
* :mod:`cclc.diagnose.localize` — robust outliers and the suspects that explain them;
* :mod:`cclc.diagnose.faults` — suspects as ``fault`` statements or a patched ``.ccl``;
* :mod:`cclc.diagnose.inject` — simulated measurements with injected faults (tests, benchmark).
"""
