"""The MSCCL-IR XML text of a lowered program, produced piece by piece.

A large schedule makes a file of a hundred megabytes or more; :func:`xml_pieces` yields one
piece per ``<gpu>`` element so that the caller writes it as a stream instead of holding
the whole text (or a tree of it) in memory. The layout is the one the runtimes' parsers and
msccl-tools files use: one element per line, two spaces of indent per level.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from backends.msccl.lower import Lowered
from cclc.ir import Buf

__all__ = ["xml_pieces"]

#: the XML's names of the buffers
_BUF = {Buf.INPUT: "i", Buf.OUTPUT: "o", Buf.SCRATCH: "s"}


def _number(value: int | None) -> int:
    """The XML's spelling of "no peer", "no dependency": -1."""
    return -1 if value is None else value


def xml_pieces(algo: Sequence[tuple[str, object]], low: Lowered) -> Iterator[str]:
    """The XML of ``low`` with the ``<algo>`` attributes ``algo`` (in order), in pieces whose
    concatenation is the file."""
    yield "<algo" + "".join(f' {name}="{value}"' for name, value in algo) + ">\n"
    i_chunks, o_chunks = low.units[Buf.INPUT], low.units[Buf.OUTPUT]
    for rank, tbs in enumerate(low.tbs):
        lines = [f'  <gpu id="{rank}" i_chunks="{i_chunks}" o_chunks="{o_chunks}" '
                 f's_chunks="{low.scratch[rank]}">\n']
        for tb in tbs:
            lines.append(f'    <tb id="{tb.id}" send="{_number(tb.send)}" '
                         f'recv="{_number(tb.recv)}" chan="{tb.chan}">\n')
            lines.extend(
                f'      <step s="{st.index}" type="{st.type}" srcbuf="{_BUF[st.sb]}" '
                f'srcoff="{_number(st.so)}" dstbuf="{_BUF[st.db]}" dstoff="{_number(st.do)}" '
                f'cnt="{st.cnt}" depid="{_number(st.depid)}" deps="{_number(st.deps)}" '
                f'hasdep="{int(st.hasdep)}"/>\n' for st in tb.steps)
            lines.append("    </tb>\n")
        lines.append("  </gpu>\n")
        yield "".join(lines)
    yield "</algo>\n"
