"""Catalogs of schedules for the faults a machine can have (``cclc catalog``).

:mod:`cclc.catalog.faultsets` enumerates fault sets by class and groups them into orbits of
the machine's symmetries, :mod:`cclc.catalog.relabel` moves a schedule along an orbit, and
:mod:`cclc.catalog.build` compiles one schedule per orbit and writes the catalog document.
"""
