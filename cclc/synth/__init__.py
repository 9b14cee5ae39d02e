"""Synthesis: schedules built from an optimization over the machine, not from a template.

``flows``: AllToAll from a max-concurrent-flow LP decomposed into weighted paths.
``trees``: AllGather / ReduceScatter / AllReduce from packings of spanning trees.
Both register as the algorithm ``synth`` (one name, disjoint collectives).
"""
