"""The parser: one test per statement kind, plus spans, separators and syntax errors."""

import pytest

from cclc.errors import Span, SyntaxErr
from dsl import ast
from dsl.parser import parse


def _only(text: str):
    """The single statement of ``text``."""
    (stmt,) = parse(text, "t.ccl").statements
    return stmt


def _setting(text: str, header: str = "topology t = torus(4, 4)"):
    """The single setting of a block holding ``text``."""
    (setting,) = _only(f"{header} {{ {text} }}").settings
    return setting


def test_empty_file_and_comments():
    assert parse("", "t.ccl").statements == ()
    assert parse("# only a comment\n\n   # another\n", "t.ccl").statements == ()


def test_topology_def():
    stmt = _only("topology pod = torus(4, 4, 4)")
    assert isinstance(stmt, ast.TopologyDef)
    assert stmt.name.text == "pod"
    assert stmt.constructor.name.text == "torus"
    assert [a.value.number.value for a in stmt.constructor.arguments] == [4, 4, 4]
    assert stmt.settings == ()
    assert stmt.span == Span("t.ccl", 1, 1, 1, 30)


def test_node_def():
    stmt = _only("node hgx = nvswitch(gpus = 8) { link 450 GB/s, 1 us; nic 8 x 400 Gb/s; ports 2 }")
    assert isinstance(stmt, ast.NodeDef)
    (gpus,) = stmt.constructor.arguments
    assert gpus.key.text == "gpus" and gpus.value.number.value == 8
    assert [type(s) for s in stmt.settings] == [ast.Link, ast.Nic, ast.Ports]


def test_collective_def():
    stmt = _only("collective a2a = alltoall on pod { size 16 MiB }")
    assert isinstance(stmt, ast.CollectiveDef)
    assert (stmt.name.text, stmt.kind.text, stmt.group.topology.text) == ("a2a", "alltoall", "pod")
    assert stmt.group.selector is None


def test_wrap():
    wrap = _setting("wrap on, off")
    assert isinstance(wrap, ast.Wrap)
    assert [f.value for f in wrap.flags] == [True, False]


def test_link_all_dimensions():
    link = _setting("link 56 GB/s, 100 ns")
    assert isinstance(link, ast.Link) and link.dim is None
    assert (link.bandwidth.number.value, link.bandwidth.unit.text) == (56, "GB/s")
    assert (link.latency.number.value, link.latency.unit.text) == (100, "ns")


def test_link_one_dimension():
    link = _setting("link dim 1: 28.5 GB/s, 0.2 us")
    assert link.dim.value == 1
    assert link.bandwidth.number.value == 28.5 and link.latency.number.value == 0.2


def test_link_without_unit_parses():
    # a missing unit is the elaborator's error, which knows what kind of unit belongs there
    link = _setting("link 56, 100 ns")
    assert link.bandwidth.unit is None


def test_fault_link_both_and_one_direction():
    both = _setting("fault link (2,3) -- (2,0)").pair
    one = _setting("fault link (2,3) -> (2,0)").pair
    assert both.both and not one.both
    assert [n.value for n in both.a.values] == [2, 3]


def test_fault_link_fabric_path():
    pair = _setting("fault link node(3).nic(1) -> leaf(1)").pair
    assert [(p.name.text, p.index.value) for p in pair.a.parts] == [("node", 3), ("nic", 1)]
    assert isinstance(pair.b, ast.Path) and pair.b.parts[0].name.text == "leaf"


def test_fault_rank():
    assert isinstance(_setting("fault rank (1,1)").rank, ast.Coord)
    assert isinstance(_setting("fault rank 5").rank, ast.Number)
    path = _setting("fault rank node(2).gpu(5)").rank
    assert [p.name.text for p in path.parts] == ["node", "gpu"]


def test_fault_group():
    group = _setting("fault group ocs7 { (0,0) -- (0,3); (1,0) -- (1,3)\n }")
    assert isinstance(group, ast.FaultGroup) and group.name.text == "ocs7"
    assert len(group.links) == 2


def test_fabric_settings():
    stmt = _only("topology c = fabric(leaf_spine) {\n nodes 16 x hgx\n rails 8; leaves 8\n"
                 " spines 4\n oversubscription 1.5\n link 400 Gb/s, 2 us\n}")
    nodes, rails, leaves, spines, over, link = stmt.settings
    assert (nodes.count.value, nodes.node_type.text) == (16, "hgx")
    assert (rails.count.value, leaves.count.value, spines.count.value) == (8, 8, 4)
    assert over.ratio.value == 1.5
    assert isinstance(link, ast.Link)


def test_nic_and_ports():
    header = "node n = pcie(gpus = 4)"
    nic = _setting("nic 2 x 200 Gb/s", header)
    assert (nic.count.value, nic.bandwidth.unit.text) == (2, "Gb/s")
    assert _setting("ports 2", header).count.value == 2


def test_size_and_sizes():
    header = "collective c = alltoall on t"
    size = _setting("size 16 MiB", header)
    assert isinstance(size, ast.Size) and size.size.unit.text == "MiB"
    sizes = _setting('sizes "skew.csv"', header)
    assert isinstance(sizes, ast.Sizes) and sizes.path.value == "skew.csv"


def test_dtype_op_root():
    header = "collective c = reduce on t"
    assert _setting("dtype bf16", header).dtype.text == "bf16"
    assert _setting("op max", header).op.text == "max"
    assert _setting("root 3", header).index.value == 3


def test_algorithm_and_schedule_hints():
    header = "collective c = alltoall on t"
    plain = _setting("algorithm pat", header).hint
    assert plain.name.text == "pat" and plain.arguments == ()
    hint = _setting("schedule pipeline(chunks = 6, buffer = 4 MiB, mode = fast)", header).hint
    keys = [a.key.text for a in hint.arguments]
    assert keys == ["chunks", "buffer", "mode"]
    assert hint.arguments[1].value.unit.text == "MiB"
    assert hint.arguments[2].value.text == "fast"


@pytest.mark.parametrize("text, name, index, ranks", [
    ("cluster.rail(0)", "rail", 0, None),
    ("cluster.node(3)", "node", 3, None),
    ("cluster.leaders", "leaders", None, None),
    ("pod.ranks[0, (1,2), node(0).gpu(1)]", "ranks", None, 3),
])
def test_group_selectors(text, name, index, ranks):
    sel = _only(f"collective c = allgather on {text}").group.selector
    assert sel.name.text == name
    assert (sel.index.value if sel.index else None) == index
    assert (len(sel.ranks) if sel.ranks else None) == ranks


def test_rank_list_may_span_lines():
    sel = _only("collective c = allgather on pod.ranks[0, 1,\n"
                "   2, 3] { size 1 MiB }").group.selector
    assert len(sel.ranks) == 4


def test_separators_newlines_and_semicolons():
    text = "topology a = torus(2) { link 1 GB/s, 1 ns }; topology b = torus(2)\n\n" \
           "# comment\ncollective c = allgather on a { size 1 MiB ;; dtype fp16 }\n"
    assert [type(s) for s in parse(text, "t.ccl").statements] == [
        ast.TopologyDef, ast.TopologyDef, ast.CollectiveDef]


def test_keywords_are_contextual():
    # `node`, `link` and `size` are names where a name is expected
    stmt = _only("topology node = node(link) { fault rank size(1) }")
    assert stmt.name.text == "node" and stmt.constructor.arguments[0].value.text == "link"


def test_numbers_keep_int_or_float():
    args = _only("topology t = torus(4, 2.5, 1e3)").constructor.arguments
    values = [a.value.number.value for a in args]
    assert values == [4, 2.5, 1000.0] and isinstance(values[0], int)


def test_spans_point_at_tokens():
    link = _setting("link 56 GB/s, 100 ns")
    assert link.bandwidth.unit.span == Span("t.ccl", 1, 36, 1, 40)
    assert link.keyword_span == Span("t.ccl", 1, 28, 1, 32)


@pytest.mark.parametrize("text, message", [
    ("topology t = torus(4) { link 5 GB/s 1 ns }", "expected ',', got the number 1"),
    ("topology t = torus(4) {", "unexpected end of file: expected a setting"),
    ("topology t torus(4)", "expected '=', got 'torus'"),
    ("topology t = torus(4) { wrap maybe }", "expected 'on' or 'off', got 'maybe'"),
    ("topology t = torus(4) { sise 1 }", "got 'sise'"),
    ("collective c = x on y { sizee 1 MiB }", "did you mean 'size'?"),
    # a keyword that starts a longer name is the name, not the keyword and a stray rest
    ("topology t = torus(4) { link_bandwidth 5 GB/s }", "got 'link_bandwidth'"),
    ("topology t = torus(4) { link 5 GB_s, 1 us }", "got 'GB_s'"),
])
def test_syntax_errors(text, message):
    with pytest.raises(SyntaxErr) as info:
        parse(text, "t.ccl")
    assert message in info.value.message
    assert info.value.span.file == "t.ccl"
    assert "__ANON" not in info.value.message and "_SEP" not in info.value.message


@pytest.mark.parametrize("number", ["9" * 100_000, "-" + "9" * 5000, "1e400", "-2.5e999"])
def test_number_too_large_is_a_syntax_error_at_the_number(number):
    # Python refuses int() of more than 4300 digits and float() overflows to inf
    with pytest.raises(SyntaxErr, match="number too large") as info:
        parse(f"topology t = torus(4) {{ link {number} GB/s, 1 us }}", "t.ccl")
    span = info.value.span
    assert (span.file, span.line, span.col) == ("t.ccl", 1, 30)
    assert span.end_col == 30 + len(number)
    assert len(info.value.message) < 80      # never the whole number
