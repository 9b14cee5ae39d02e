"""The command line: ``cclc check | compile | verify | sim | bounds | ...``.

The only place that prints, exits, and wires dsl/, cclc/ and backends/ together. Each
subcommand lives in a module of :mod:`cclc.commands` (named after the command, or
``import_topology`` for ``cclc import``: ``import`` is a Python keyword) with
``add_parser(subparsers)`` and ``run(args) -> int``.

This module imports nothing but :mod:`sys` at its top: it is the console entry point, and a
Ctrl-C during the seconds the commands spend importing numpy, lark or OR-Tools must end in
"interrupted" and exit status 130, not a traceback, so every import happens inside
:func:`main`'s handler.
"""

from __future__ import annotations

import sys

TYPE_CHECKING = False       # typing.TYPE_CHECKING without importing typing
if TYPE_CHECKING:
    import argparse

    from cclc.errors import CclError

__all__ = ["main", "program"]

#: the modules of :mod:`cclc.commands` whose subcommands ``--help`` lists, in this order
COMMANDS = ["check", "compile", "catalog", "verify", "sim", "bounds", "viz", "tune", "diagnose",
            "import_topology"]

EPILOG = """examples:
  cclc check examples/torus5x5_fault.ccl
  cclc compile examples/torus5x5.ccl -o out/
  cclc verify out/a2a.schedule.json
  cclc sim out/a2a.schedule.json

Run 'cclc COMMAND --help' for the details of one command."""


def build_parser() -> argparse.ArgumentParser:
    # imported inside main's handler, so that a Ctrl-C while importing ends in 'interrupted' (see
    # the module docstring)
    import argparse
    import importlib

    from cclc import __version__

    parser = argparse.ArgumentParser(
        prog="cclc",
        description="cclc compiles a machine and a collective, written in a .ccl file, into a "
                    "verified communication schedule and code for NCCL, MSCCL++ and MSCCL.",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"cclc {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS:
        importlib.import_module(f"cclc.commands.{name}").add_parser(sub)
    return parser


#: whether a SIGINT came (set by :func:`_on_sigint`)
_interrupted = False


def _on_sigint(signum, frame) -> None:
    """Python's own reaction to Ctrl-C (raise KeyboardInterrupt), remembered: an extension
    module interrupted while it initializes may turn the KeyboardInterrupt into another error
    (numpy's C core raises ImportError "PyCapsule_Import could not import module 'datetime'"),
    which must end in "interrupted" as well."""
    global _interrupted
    _interrupted = True
    raise KeyboardInterrupt


def main(argv: list[str] | None = None, own_process: bool = False) -> int:
    """Run the command ``argv`` (default: ``sys.argv[1:]``); returns the exit status.
    ``own_process``: the process runs this command alone (:func:`program`), so its allocator
    may keep freed memory for reuse (:mod:`cclc.allocator`); a caller's process keeps its own."""
    global _interrupted
    _interrupted = False
    previous = None
    try:
        # imported inside main's handler, so that a Ctrl-C while importing ends in
        # 'interrupted' (see the module docstring)
        import signal

        try:
            previous = signal.signal(signal.SIGINT, _on_sigint)
        except ValueError:
            pass            # not the main thread (an embedding caller's): its signals are its own
        status = _run(argv, own_process)
    except KeyboardInterrupt:
        return _say_interrupted()
    except Exception:
        if _interrupted:    # what a Ctrl-C became inside an extension module
            return _say_interrupted()
        raise
    if previous is not None:
        signal.signal(signal.SIGINT, previous)
    return status


def _say_interrupted() -> int:
    # a second Ctrl-C while we say so must not print a traceback either
    import signal

    try:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    except ValueError:
        pass                # not the main thread
    print("interrupted", file=sys.stderr)
    return 130


def _run(argv: list[str] | None, own_process: bool) -> int:
    # imported inside main's handler, so that a Ctrl-C while importing ends in 'interrupted' (see
    # the module docstring)
    from cclc.allocator import reuse_freed_memory
    from cclc.errors import CclError, render_error

    if own_process:
        reuse_freed_memory()    # fewer page faults on large compiles (see cclc.allocator)
    _escape_what_the_terminal_cannot_show()
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    try:
        return int(args.run(args) or 0)
    except CclError as err:
        print(render_error(err, _source_of(err)), file=sys.stderr)
        return 2
    except OSError as err:
        # a path the user named cannot be read or written (too long, a folder, no permission)
        where = f" '{err.filename}'" if err.filename else ""
        print(f"error: cannot use{where}: {err.strerror or err}", file=sys.stderr)
        return 2
    except MemoryError as err:
        # the size check refuses what its estimates say will not fit; an estimate that falls
        # short must still end in a sentence, not a traceback (numpy's message names the array)
        detail = f" ({err})" if str(err) else ""
        print(f"error: ran out of memory{detail}; the size check's estimate fell short for this "
              "input: use a smaller topology, group, size or chunks", file=sys.stderr)
        return 2


def _escape_what_the_terminal_cannot_show() -> None:
    """Print a character the output's encoding lacks as an escape (``\\u043e``), not as a
    traceback: a file name or source line may hold any character, the terminal may be ASCII."""
    # imported inside main's handler, so that a Ctrl-C while importing ends in 'interrupted' (see
    # the module docstring)
    import io

    for stream in (sys.stdout, sys.stderr):
        if not isinstance(stream, io.TextIOWrapper):
            continue    # not a text stream cclc may change (a test's capture)
        try:
            stream.reconfigure(errors="backslashreplace")
        except (ValueError, OSError):
            pass        # a closed or detached stream


def _source_of(err: CclError) -> str | None:
    """The text of the file an error points into, decoded as the parser decoded it; ``None``
    when it cannot be read or is not text (the error then says so), so no line is shown."""
    # imported inside main's handler, so that a Ctrl-C while importing ends in 'interrupted' (see
    # the module docstring)
    from dsl import display_source

    text = None if err.span is None else display_source(err.span.file)
    return None if text is None or "\x00" in text else text


def program() -> None:
    """The ``cclc`` program (the console script, and ``python -m cclc.cli``): :func:`main` in
    a process of its own."""
    sys.exit(main(own_process=True))


if __name__ == "__main__":
    program()
