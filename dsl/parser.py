"""Text to syntax tree: ``parse(text, filename) -> ast.File``.

lark parses with the LALR grammar in ``ccl.lark``; a Transformer run after ``parse()`` turns the
tree into :mod:`dsl.ast` nodes with spans. A lark error becomes a :class:`SyntaxErr` whose
message names what was expected in words ("a number", "'{'", "';' or a new line"), never a
grammar-internal terminal name.
"""

from __future__ import annotations

import difflib
import math
import re

from lark import Lark, Token, Transformer, v_args
from lark.exceptions import UnexpectedCharacters, UnexpectedInput, UnexpectedToken, VisitError

from cclc.errors import CclError, Span, SyntaxErr
from dsl import ast
from dsl.source import BOM, describe_character

__all__ = ["PARSER", "describe_terminal", "parse"]

PARSER = Lark.open("ccl.lark", rel_to=__file__, parser="lalr", propagate_positions=True,
                   maybe_placeholders=True)

# What a terminal is, in words. Keywords and punctuation are derived from the grammar below.
_TERMINAL_WORDS = {
    "NAME": "a name",
    "NUMBER": "a number",
    "UNIT": "a unit such as GB/s, Gb/s, us or MiB",
    "STRING": 'a quoted file name such as "sizes.csv"',
    "_SEP": "';' or a new line",
    "$END": "the end of the file",
}
_KEYWORDS: dict[str, str] = {}     # terminal name -> keyword spelling
for _term in PARSER.terminals:
    if _term.name in _TERMINAL_WORDS:
        continue
    if _term.pattern.type == "re" and _term.pattern.value.endswith(r"\b"):
        _KEYWORDS[_term.name] = _term.pattern.value[:-2]
        _TERMINAL_WORDS[_term.name] = f"'{_KEYWORDS[_term.name]}'"
    elif _term.pattern.type == "str":
        _TERMINAL_WORDS[_term.name] = f"'{_term.pattern.value}'"
# Keywords first (in grammar order), then kinds of value, then punctuation, then separators.
_ORDER = {name: i for i, name in enumerate(
    list(_KEYWORDS) + ["NAME", "NUMBER", "UNIT", "STRING"]
    + [t.name for t in PARSER.terminals if t.pattern.type == "str"] + ["_SEP", "$END"])}


def describe_terminal(name: str) -> str:
    """A grammar terminal in words, e.g. ``'LBRACE'`` -> ``"'{'"``."""
    return _TERMINAL_WORDS.get(name, name.lower())


def parse(text: str, filename: str) -> ast.File:
    """Parse ``.ccl`` source ``text``; ``filename`` goes into every span.

    Raises :class:`SyntaxErr` (with a span) when the text does not follow the grammar.

    >>> f = parse("topology t = torus(4, 4) { link 50 GB/s, 100 ns }", "t.ccl")
    >>> f.statements[0].name.text
    't'
    """
    text = text.removeprefix(BOM)     # as when read from a file: see dsl.source
    try:
        tree = PARSER.parse(text)
    except UnexpectedInput as err:
        raise _syntax_error(err, text, filename) from None
    try:
        return _ToAst(filename).transform(tree)
    except VisitError as err:
        # lark wraps what a rule raises; a user error (a number too large) is the user's
        if isinstance(err.orig_exc, CclError):
            raise err.orig_exc from None
        raise


# ---- syntax errors ------------------------------------------------------------------------------


def _syntax_error(err: UnexpectedInput, text: str, filename: str) -> SyntaxErr:
    """A lark error as a :class:`SyntaxErr` that says, in words, what was expected."""
    if isinstance(err, UnexpectedCharacters):
        line, col = err.line, err.column
        if err.char == '"':
            return SyntaxErr("unterminated string: a quoted name must end with '\"' on the same "
                             "line", Span(filename, line, col, line, col + 1))
        start: int = err.pos_in_stream or 0
        word = _word_at(text, start)
        expected = _accepted_before_bad_character(text) or set(err.allowed)
        got = f"'{word}'" if word.isprintable() and not word.isspace() else \
            f"the character U+{ord(word):04X}"
        span = Span(filename, line, col, line, col + len(word))
    else:
        assert isinstance(err, UnexpectedToken)
        token = err.token
        # The LALR tables merge states, so err.expected can list tokens that would fail a
        # moment later; accepts() tries each one and keeps only those that really fit.
        expected = set(err.interactive_parser.accepts()) if err.interactive_parser else set()
        expected = expected or set(err.expected)
        if token.type == "$END":
            return _end_of_file_error(expected, text, filename)
        start = token.start_pos or 0
        word = str(token)
        got = _describe_token(token)
        if token.type == "_SEP" and word.startswith("\n"):
            span = Span(filename, token.line, token.column, token.line, token.column + 1)
        else:
            span = Span(filename, token.line, token.column, token.end_line, token.end_column)
        if token.type == "LBRACE" and "TOPOLOGY" in expected:
            return SyntaxErr("a block must start with '{' on the same line as its statement",
                             span)
    message = f"expected {_describe_expected(expected)}, got {got}"
    foreign = _first_non_ascii(text, start)
    if foreign is not None:
        # Only comments and quoted names may hold non-ASCII text. Point at the character
        # itself (a Cyrillic 'о' inside 'topology' is invisible otherwise) and name it.
        line = text.count("\n", 0, foreign) + 1
        col = foreign - (text.rfind("\n", 0, foreign) + 1) + 1
        span = Span(filename, line, col, line, col + 1)
        message = (f"unexpected character {describe_character(text[foreign])} where only "
                   f"ASCII is allowed; expected {_describe_expected(expected)}")
        word = _word_at(text, start)
    keywords = [_KEYWORDS[t] for t in expected if t in _KEYWORDS]
    close = difflib.get_close_matches(word, keywords, n=1) if word.isidentifier() else []
    if close:
        message += f"; did you mean '{close[0]}'?"
    return SyntaxErr(message, span)


def _word_at(text: str, start: int) -> str:
    """The word (letters, digits, '_' of any script) or else the one character at ``start``."""
    word = re.match(r"\w+|.", text[start:], re.DOTALL)
    return word.group(0) if word else ""


def _first_non_ascii(text: str, start: int) -> int | None:
    """Where the first non-ASCII character is in the word (or lone character) at ``start``."""
    for offset, char in enumerate(_word_at(text, start)):
        if not char.isascii():
            return start + offset
    return None


def _accepted_before_bad_character(text: str) -> set[str]:
    """What the parser would have accepted where the lexer stopped."""
    interactive = PARSER.parse_interactive(text)
    try:
        for _ in interactive.iter_parse():
            pass
    except UnexpectedCharacters:
        return set(interactive.accepts())
    except UnexpectedInput:
        pass
    return set()


def _end_of_file_error(expected: set[str], text: str, filename: str) -> SyntaxErr:
    """"unexpected end of file", placed just after the last thing written."""
    lines = re.sub(r"#[^\n]*", "", text).rstrip().splitlines() or [""]
    line, col = len(lines), len(lines[-1]) + 1
    message = f"unexpected end of file: expected {_describe_expected(expected)}"
    if "RBRACE" in expected:
        opened = _unclosed_brace(text)
        if opened is not None:
            message += f" to close the '{{' on line {opened}"
    return SyntaxErr(message, Span(filename, line, col, line, col + 1))


def _unclosed_brace(text: str) -> int | None:
    """The line of the innermost '{' that is never closed, if the text lexes."""
    stack: list[int | None] = []
    try:
        for token in PARSER.lex(text):
            if token.type == "LBRACE":
                stack.append(token.line)
            elif token.type == "RBRACE" and stack:
                stack.pop()
    except UnexpectedInput:
        return None
    return stack[-1] if stack else None


def _describe_token(token: Token) -> str:
    if token.type == "_SEP":
        return "the end of the line" if str(token).startswith("\n") else "';'"
    if token.type == "NUMBER":
        return f"the number {token}"
    if token.type == "STRING":
        return str(token)
    return f"'{token}'"


def _describe_expected(expected: set[str]) -> str:
    ordered = sorted(expected, key=lambda t: (_ORDER.get(t, 99), t))
    keywords = [_KEYWORDS[t] for t in ordered if t in _KEYWORDS]
    words: list[str] = []
    if len(keywords) > 3:      # the start of a block: name the settings as one choice
        words.append(f"a setting ({', '.join(keywords)})")
    else:
        words += [f"'{k}'" for k in keywords]
    for t in ordered:
        if t == "_SEP":
            words += ["';'", "a new line"]
        elif t not in _KEYWORDS:
            words.append(describe_terminal(t))
    if not words:
        return "nothing more"
    if len(words) == 1:
        return words[0]
    return ", ".join(words[:-1]) + " or " + words[-1]


# ---- tree to AST --------------------------------------------------------------------------------


def _shorten(number: str) -> str:
    """A number's text as a message shows it: a long one by its start and its length."""
    if len(number) <= 24:
        return number
    return f"{number[:12]}... ({len(number)} characters)"


def _token_span(filename: str, token: Token) -> Span:
    # the lexer sets every position of the tokens it makes
    return Span(filename, token.line or 1, token.column or 1, token.end_line, token.end_column)


@v_args(meta=True)
class _ToAst(Transformer):
    """Builds :mod:`dsl.ast` nodes bottom-up; keyword tokens are dropped after giving spans."""

    def __init__(self, filename: str):
        super().__init__(visit_tokens=False)
        self.filename = filename

    def _span(self, meta) -> Span:
        return Span(self.filename, meta.line, meta.column, meta.end_line, meta.end_column)

    @staticmethod
    def _values(children) -> list:
        """Children without keyword tokens and the ``None`` of absent optional parts."""
        return [c for c in children if c is not None and not isinstance(c, Token)]

    # -- values
    def name(self, meta, children):
        return ast.Name(str(children[0]), _token_span(self.filename, children[0]))

    def unit(self, meta, children):
        return ast.Name(str(children[0]), _token_span(self.filename, children[0]))

    def number(self, meta, children):
        text = str(children[0])
        span = _token_span(self.filename, children[0])
        is_int = re.fullmatch(r"-?\d+", text) is not None
        try:
            value = int(text) if is_int else float(text)
        except ValueError:
            # Python refuses to convert integers of more than a few thousand digits
            value = math.inf
        if not math.isfinite(value):
            raise SyntaxErr(f"number too large: {_shorten(text)}", span)
        return ast.Number(value, text, span)

    def string(self, meta, children):
        return ast.String(str(children[0])[1:-1], _token_span(self.filename, children[0]))

    def quantity(self, meta, children):
        number, unit = children
        return ast.Quantity(number, unit, self._span(meta))

    def argument(self, meta, children):
        key, value = children
        return ast.Argument(key, value, self._span(meta))

    def arguments(self, meta, children):
        return tuple(children)

    def call(self, meta, children):
        name, arguments = children
        return ast.Call(name, arguments, self._span(meta))

    def hint(self, meta, children):
        name, arguments = children
        return ast.Call(name, arguments or (), self._span(meta))

    def coord(self, meta, children):
        return ast.Coord(tuple(children), self._span(meta))

    def path_part(self, meta, children):
        name, index = children
        return ast.PathPart(name, index, self._span(meta))

    def path(self, meta, children):
        return ast.Path(tuple(children), self._span(meta))

    def link_pair(self, meta, children):
        a, arrow, b = children
        return ast.LinkPair(a, b, arrow.type == "BOTH", self._span(meta))

    def index(self, meta, children):
        return children[0]

    def rank_list(self, meta, children):
        return tuple(children)

    def selector(self, meta, children):
        name, narrowing = children
        index = narrowing if isinstance(narrowing, ast.Number) else None
        ranks = narrowing if isinstance(narrowing, tuple) else None
        return ast.Selector(name, index, ranks, self._span(meta))

    def group(self, meta, children):
        topology, selector = children
        return ast.Group(topology, selector, self._span(meta))

    def flag(self, meta, children):
        return ast.Flag(children[0].type == "ON", self._span(meta))

    # -- settings
    def wrap(self, meta, children):
        return ast.Wrap(span=self._span(meta), flags=tuple(self._values(children)))

    def link(self, meta, children):
        values = self._values(children)
        dim = values.pop(0) if len(values) == 3 else None
        bandwidth, latency = values
        return ast.Link(span=self._span(meta), dim=dim, bandwidth=bandwidth, latency=latency)

    def fault_link(self, meta, children):
        (pair,) = self._values(children)
        return ast.FaultLink(span=self._span(meta), pair=pair)

    def fault_rank(self, meta, children):
        (rank,) = self._values(children)
        return ast.FaultRank(span=self._span(meta), rank=rank)

    def fault_switch(self, meta, children):
        return ast.FaultSwitch(span=self._span(meta), device=self._values(children)[0])

    def fault_nic(self, meta, children):
        return ast.FaultNic(span=self._span(meta), device=self._values(children)[0])

    def fault_group(self, meta, children):
        name, *links = self._values(children)
        return ast.FaultGroup(span=self._span(meta), name=name, links=tuple(links))

    def nodes(self, meta, children):
        count, node_type = self._values(children)
        return ast.Nodes(span=self._span(meta), count=count, node_type=node_type)

    def rails(self, meta, children):
        return ast.Rails(span=self._span(meta), count=self._values(children)[0])

    def leaves(self, meta, children):
        return ast.Leaves(span=self._span(meta), count=self._values(children)[0])

    def spines(self, meta, children):
        return ast.Spines(span=self._span(meta), count=self._values(children)[0])

    def pods(self, meta, children):
        return ast.Pods(span=self._span(meta), count=self._values(children)[0])

    def cores(self, meta, children):
        return ast.Cores(span=self._span(meta), count=self._values(children)[0])

    def oversubscription(self, meta, children):
        ratio, *core = self._values(children)
        return ast.Oversubscription(span=self._span(meta), ratio=ratio,
                                    core_ratio=core[0] if core else None)

    def routing(self, meta, children):
        return ast.Routing(span=self._span(meta), mode=self._values(children)[0])

    def nic(self, meta, children):
        count, bandwidth = self._values(children)
        return ast.Nic(span=self._span(meta), count=count, bandwidth=bandwidth)

    def ports(self, meta, children):
        return ast.Ports(span=self._span(meta), count=self._values(children)[0])

    def multicast(self, meta, children):
        return ast.Multicast(span=self._span(meta))

    def size(self, meta, children):
        return ast.Size(span=self._span(meta), size=self._values(children)[0])

    def sizes(self, meta, children):
        return ast.Sizes(span=self._span(meta), path=self._values(children)[0])

    def dtype(self, meta, children):
        return ast.DTypeSetting(span=self._span(meta), dtype=self._values(children)[0])

    def algorithm(self, meta, children):
        return ast.Algorithm(span=self._span(meta), hint=self._values(children)[0])

    def schedule(self, meta, children):
        return ast.Schedule(span=self._span(meta), hint=self._values(children)[0])

    def op(self, meta, children):
        return ast.Op(span=self._span(meta), op=self._values(children)[0])

    def root(self, meta, children):
        return ast.Root(span=self._span(meta), index=self._values(children)[0])

    # -- statements
    def topology_block(self, meta, children):
        return tuple(children)

    node_block = collective_block = topology_block

    def topology_def(self, meta, children):
        _, name, constructor, settings = children
        return ast.TopologyDef(name, constructor, settings or (), self._span(meta))

    def node_def(self, meta, children):
        _, name, constructor, settings = children
        return ast.NodeDef(name, constructor, settings or (), self._span(meta))

    def collective_def(self, meta, children):
        _, name, kind, _, group, settings = children
        return ast.CollectiveDef(name, kind, group, settings or (), self._span(meta))

    def start(self, meta, children):
        return ast.File(self.filename, tuple(children))

    def __default__(self, data, children, meta):  # pragma: no cover - grammar/AST mismatch
        raise AssertionError(f"no AST rule for grammar rule '{data}'")

