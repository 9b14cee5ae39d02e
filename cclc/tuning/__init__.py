"""NCCL parameter tuning (AutoCCL): the space, profilers, searches, and the table they make.

``space`` (what can be tuned per collective and NCCL version), ``profilers`` (model, CSV,
nccl-tests), ``search`` (coordinate descent, exhaustive, random; budget; cache), ``baseline``
(NCCL's default choice, from cclc.nccl_model), ``table`` (a whole table with its process-wide
settings) and ``outputs`` (CSV/JSON, NCCL_CONF_FILE, example-tuner CSV, plugin rows). The C
plugin is rendered by ``backends.tuner``. User documentation: docs/tuning.md.
"""
