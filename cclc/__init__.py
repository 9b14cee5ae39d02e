"""cclc: a compiler for collective-communication schedules."""

__version__ = "0.1.0"
