"""The command line: ``cclc check | compile | verify | sim | bounds | ...``.

The only place that prints, exits, and wires dsl/, cclc/ and backends/ together. Each
subcommand lives in ``cclc/commands/<name>.py`` with ``add_parser(subparsers)`` and
``run(args) -> int``.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from cclc import __version__
from cclc.errors import CclError, render_error

__all__ = ["main"]

#: subcommands in the order ``--help`` lists them
COMMANDS = ["check", "compile", "verify", "sim", "bounds", "viz", "tune", "diagnose", "import"]

EPILOG = """examples:
  cclc check examples/torus5x5_fault.ccl
  cclc compile examples/torus5x5.ccl -o out/
  cclc verify out/a2a.schedule.json
  cclc sim out/a2a.schedule.json

Run 'cclc COMMAND --help' for the details of one command."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="cclc",
        description="cclc compiles a machine and a collective, written in a .ccl file, into a "
                    "verified communication schedule and code for NCCL and MSCCL.",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"cclc {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS:
        importlib.import_module(f"cclc.commands.{name}").add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    from cclc.allocator import reuse_freed_memory

    reuse_freed_memory()        # fewer page faults on large compiles (see cclc.allocator)
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
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


def _escape_what_the_terminal_cannot_show() -> None:
    """Print a character the output's encoding lacks as an escape (``\\u043e``), not as a
    traceback: a file name or source line may hold any character, the terminal may be ASCII."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.reconfigure(errors="backslashreplace")
        except (AttributeError, ValueError, OSError):
            pass        # not a text stream cclc may change (a test's capture, a closed pipe)


def _source_of(err: CclError) -> str | None:
    """The text of the file an error points into, decoded as the parser decoded it."""
    from dsl import display_source

    return None if err.span is None else display_source(err.span.file)


if __name__ == "__main__":
    sys.exit(main())
