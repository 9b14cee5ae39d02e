"""NCCL topology XML in: ``node NAME = nccl_xml("file.xml")`` gives the hand-written node.

The XML files are written from NCCL's format (src/graph/xml.cc, topo.cc); the references are
the hand-written node types of the examples and the parameters a generator put into a file.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cclc import cli
from cclc.errors import TopologyError, render_error
from cclc.nccl_topo import node_type_from_xml, read_nccl_topology
from cclc.topology import leaf_spine, single_node
from dsl import load, loads

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
HGX_XML = EXAMPLES / "nccl" / "hgx_h100.xml"
PCIE_XML = EXAMPLES / "nccl" / "pcie_4gpu.xml"


def _same_topology(a, b):
    assert a.vertex_names == b.vertex_names
    for column in ("link_src", "link_dst", "link_bandwidth", "link_latency", "link_kind"):
        np.testing.assert_array_equal(getattr(a, column), getattr(b, column))


def test_hgx_xml_is_the_node_of_hgx_node_ccl():
    by_hand = load(EXAMPLES / "hgx_node.ccl").node_types["hgx"]
    imported = read_nccl_topology(HGX_XML, "hgx")
    assert imported.node == by_hand
    assert imported.nvlinks_per_gpu == (18,) * 8
    assert imported.nic_names == tuple(f"mlx5_{i}" for i in range(8))
    assert imported.nic_gpus == tuple((i,) for i in range(8))
    _same_topology(single_node("box", imported.node), single_node("box", by_hand))
    _same_topology(leaf_spine("c", 4, imported.node, 8, None, 8, 1.0, 50e9, 2e-6),
                   leaf_spine("c", 4, by_hand, 8, None, 8, 1.0, 50e9, 2e-6))


def test_pcie_xml_is_the_node_of_pcie_oversubscribed_ccl():
    by_hand = load(EXAMPLES / "pcie_oversubscribed.ccl").node_types["box"]
    assert read_nccl_topology(PCIE_XML, "box").node == by_hand


def test_the_example_file_builds_a_fabric_from_the_xml():
    program = load(EXAMPLES / "nccl" / "hgx_from_nccl.ccl")
    hand = load(EXAMPLES / "hgx_node.ccl")
    _same_topology(program.topologies["box"], hand.topologies["box"])
    assert program.topologies["cluster"].n_ranks == 32


def test_link_and_ports_settings_override_the_file(tmp_path):
    (tmp_path / "n.xml").write_bytes(HGX_XML.read_bytes())
    program = loads('node h = nccl_xml("n.xml") { link 370.8 GB/s, 2 us; ports 2 }',
                    str(tmp_path / "t.ccl"))
    node = program.node_types["h"]
    assert (node.bandwidth, node.latency, node.nic_ports) == (370.8e9, 2e-6, 2)
    assert (node.nics, node.nic_bandwidth) == (8, 50e9)


# ---- generated files against the parameters that made them -------------------------------------


def _nvswitch_xml(sm: int, links: list[list[int]], nics_per_gpu: dict[int, int],
                  speed_mbps: int) -> str:
    """One PCIe switch per GPU, holding the GPU and its NICs; NVLinks to four NVSwitches."""
    out = ['<system version="1"><cpu numaid="0">']
    net = 0
    for g, counts in enumerate(links):
        out.append(f'<pci busid="0000:{16 + 4 * g:02x}:00.0" class="0x060400" '
                   'link_speed="32.0 GT/s PCIe" link_width="16">')
        out.append(f'<pci busid="0000:{17 + 4 * g:02x}:00.0" class="0x030200" '
                   f'link_speed="32.0 GT/s PCIe" link_width="16"><gpu dev="{g}" sm="{sm}">')
        out += [f'<nvlink target="0000:0{s}:00.0" count="{c}" tclass="0x068000"/>'
                for s, c in enumerate(counts) if c]
        out.append('</gpu></pci>')
        for _ in range(nics_per_gpu.get(g, 0)):
            out.append(f'<pci busid="0000:{18 + 4 * g:02x}:0{net % 8}.0" class="0x020700" '
                       f'link_speed="32.0 GT/s PCIe" link_width="16"><nic><net name="mlx5_'
                       f'{net}" dev="{net}" speed="{speed_mbps}"/></nic></pci>')
            net += 1
        out.append('</pci>')
    out.append('</cpu></system>')
    return "\n".join(out)


@settings(max_examples=40, deadline=None)
@given(gpus=st.integers(1, 16), per_gpu=st.integers(1, 18), sm=st.sampled_from([70, 80, 90, 100]),
       nics=st.integers(0, 16), speed=st.sampled_from([100_000, 200_000, 400_000, 800_000]),
       data=st.data())
def test_generated_nvswitch_node_imports_to_its_parameters(gpus, per_gpu, sm, nics, speed, data):
    # every GPU has per_gpu links spread over up to four switches; NIC i beside GPU i*g/n
    links = []
    for _ in range(gpus):
        cuts = sorted(data.draw(st.lists(st.integers(0, per_gpu), min_size=3, max_size=3)))
        links.append([b - a for a, b in zip([0, *cuts], [*cuts, per_gpu], strict=True)])
    placement: dict[int, int] = {}
    for i in range(nics):
        placement[i * gpus // nics] = placement.get(i * gpus // nics, 0) + 1
    imported = node_type_from_xml(_nvswitch_xml(sm, links, placement, speed), "g.xml", "n")
    per_link = {70: 25e9, 80: 25e9, 90: 25e9, 100: 50e9}[sm]
    assert imported.node == replace(imported.node, interconnect="nvswitch", gpus=gpus,
                                    bandwidth=per_gpu * per_link, latency=1e-6, nics=nics,
                                    nic_bandwidth=speed * 125e3 if nics else 0.0, nic_ports=1)
    assert [g for near in imported.nic_gpus for g in near] == [i * gpus // nics
                                                               for i in range(nics)]


@settings(max_examples=30, deadline=None)
@given(speeds=st.lists(st.sampled_from(["8.0 GT/s PCIe", "16.0 GT/s PCIe", "32.0 GT/s PCIe",
                                         "64.0 GT/s PCIe", "16 GT/s"]), min_size=1, max_size=8),
       widths=st.lists(st.sampled_from([1, 4, 8, 16]), min_size=8, max_size=8))
def test_generated_pcie_node_takes_the_slowest_gpu_link_as_nccl_computes_it(speeds, widths):
    gt = {"8.0": 8, "16.0": 16, "32.0": 32, "64.0": 64, "16": 16}
    xml = ['<system version="1"><cpu numaid="0">']
    expected = []
    # widths holds one entry for each of the most GPUs drawn: the zip stops at the GPUs drawn
    for g, (speed, width) in enumerate(zip(speeds, widths, strict=False)):
        xml.append(f'<pci busid="0000:{g + 1:02x}:00.0" class="0x030000" link_speed="{speed}" '
                   f'link_width="{width}"><gpu dev="{g}" sm="86"/></pci>')
        # NCCL: 100 Mb/s units per lane = GT/s * 7.5 (128b/130b rounded), / 80 -> GB/s
        expected.append(gt[speed.split()[0]] * 7.5 * width / 80 * 1e9)
    xml.append("</cpu></system>")
    node = node_type_from_xml("".join(xml), "p.xml", "p").node
    assert (node.interconnect, node.gpus, node.nics) == ("pcie", len(speeds), 0)
    assert node.bandwidth == pytest.approx(min(expected))
    assert node.latency == 2e-6


# ---- files that are not what cclc can import ---------------------------------------------------

BAD = {
    "not_xml": ("node hgx = nvswitch(gpus = 8)\n", 1, 1, "not an NCCL topology file: XML error"),
    "msccl": ('<algo name="a" nchunksperloop="8" nchannels="1">\n  <gpu id="0"/>\n</algo>\n',
              1, 1, "the root element is <algo>"),
    "no_gpu": ('<system version="1">\n  <cpu numaid="0"/>\n</system>\n', 1, 1, "no <gpu>"),
    "gpu_to_gpu": ('<system version="1"><cpu numaid="0">\n'
                   '<pci busid="0000:01:00.0" class="0x030200"><gpu dev="0" sm="70">\n'
                   '  <nvlink target="0000:02:00.0" count="2" tclass="0x030200"/>\n'
                   '</gpu></pci></cpu></system>\n', 3, 3, "direct GPU-to-GPU NVLink"),
    "partial_nvlink": ('<system version="1"><cpu numaid="0">\n'
                       '<pci busid="0000:01:00.0" class="0x030200"><gpu dev="0" sm="90">'
                       '<nvlink target="0000:05:00.0" count="18" tclass="0x068000"/></gpu></pci>\n'
                       '<pci busid="0000:02:00.0" class="0x030200"><gpu dev="1" sm="90"/></pci>\n'
                       '</cpu></system>\n', 3, 44, "GPU dev 1 has no NVLink"),
    "nic_without_net": ('<system version="1"><cpu numaid="0">\n'
                        '<pci busid="0000:01:00.0" class="0x030000" link_speed="16.0 GT/s PCIe" '
                        'link_width="16"><gpu dev="0" sm="80"/></pci>\n'
                        '<pci busid="0000:02:00.0" class="0x020700"><nic name="mlx5_0" '
                        'speed="400"/></pci>\n</cpu></system>\n', 3, 44, "without a <net>"),
    "unknown_sm": ('<system version="1"><cpu numaid="0">\n'
                   '<pci busid="0000:01:00.0" class="0x030200"><gpu dev="0" sm="120">'
                   '<nvlink target="0000:05:00.0" count="6" tclass="0x068000"/></gpu></pci>\n'
                   '</cpu></system>\n', 2, 44, "no NVLink rate is known for sm=\"120\""),
    "no_link_speed": ('<system version="1"><cpu numaid="0">\n'
                      '<pci busid="0000:01:00.0" class="0x030000"><gpu dev="0" sm="80"/></pci>\n'
                      '</cpu></system>\n', 2, 1, "needs link_speed and link_width"),
    "bad_dev": ('<system version="1"><cpu numaid="0">\n'
                '<pci busid="0000:01:00.0" class="0x030000"><gpu dev="zero" sm="80"/></pci>\n'
                '</cpu></system>\n', 2, 44, "dev=\"zero\" of <gpu> is not a whole number"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_file_is_an_error_placed_in_the_file(case):
    text, line, col, words = BAD[case]
    with pytest.raises(TopologyError) as info:
        node_type_from_xml(text, f"{case}.xml", "n")
    err = info.value
    assert words in err.message
    assert (err.span.file, err.span.line, err.span.col) == (f"{case}.xml", line, col)


def test_nic_far_from_the_models_gpu_is_refused():
    # 2 GPUs, 1 NIC beside GPU 1: the model puts NIC 0 of 1 beside GPU 0
    xml = _nvswitch_xml(90, [[18, 0, 0, 0], [18, 0, 0, 0]], {1: 1}, 400_000)
    with pytest.raises(TopologyError, match="puts NIC 0 of 1 beside GPU 0"):
        node_type_from_xml(xml, "far.xml", "n")


@pytest.fixture
def run_cli(monkeypatch, capsys):
    monkeypatch.setattr(cli, "COMMANDS", ["check", "import_topology"])

    def run(*argv):
        code = cli.main([str(a) for a in argv])
        out, err = capsys.readouterr()
        return code, out, err
    return run


def test_cli_shows_the_xml_line_with_a_caret(tmp_path, run_cli, monkeypatch):
    text = BAD["gpu_to_gpu"][0]
    (tmp_path / "node.xml").write_text(text)
    (tmp_path / "t.ccl").write_text('node n = nccl_xml("node.xml")\n')
    monkeypatch.chdir(tmp_path)
    code, out, err = run_cli("check", "t.ccl")
    assert code == 2 and out == ""
    assert err.splitlines()[0].startswith("node.xml:3:3: error: an NVLink to a device of class "
                                          "0x030200")
    assert err.splitlines()[1] == text.splitlines()[2]
    assert err.splitlines()[2] == "  ^"
    assert "Traceback" not in err


@pytest.mark.parametrize("source, words", [
    ('node n = nccl_xml("missing.xml")', "cannot read the NCCL topology file 'missing.xml'"),
    ("node n = nccl_xml(8)", "takes the name of an NCCL topology file"),
    ('node n = nccl_xml("n.xml") { nic 8 x 400 Gb/s }', "NICs and their speeds come from"),
    ('node n = nccl_xm("n.xml")', "did you mean 'nccl_xml'"),
])
def test_language_errors(tmp_path, source, words):
    (tmp_path / "n.xml").write_bytes(PCIE_XML.read_bytes())
    with pytest.raises(Exception) as info:
        loads(source, str(tmp_path / "t.ccl"))
    assert words in render_error(info.value)
    assert info.value.span.file == str(tmp_path / "t.ccl")


@pytest.mark.parametrize("xml, name", [(HGX_XML, "hgx"), (PCIE_XML, "box")])
def test_import_prints_a_statement_that_gives_the_same_node(run_cli, xml, name):
    code, out, err = run_cli("import", xml, "--name", name)
    assert code == 0 and err == ""
    assert load(EXAMPLES / "nccl" / "hgx_from_nccl.ccl")
    from_text = loads(out, "printed.ccl").node_types[name]
    assert from_text == read_nccl_topology(xml, name).node
    assert "mlx5_0 (GPU 0" in out


@pytest.mark.parametrize("argv, words", [
    (["import", "missing.xml"], "cannot use 'missing.xml'"),
    (["import", "/dev/null", "--name", "2x"], "is not a .ccl name"),
    (["import", "."], "not a regular file"),
])
def test_import_errors(run_cli, argv, words):
    code, out, err = run_cli(*argv)
    assert code == 2 and out == "" and words in err and "Traceback" not in err


def test_import_of_a_ccl_file_points_into_it(run_cli):
    code, out, err = run_cli("import", EXAMPLES / "hgx_node.ccl")
    assert code == 2
    assert err.startswith(f"{EXAMPLES / 'hgx_node.ccl'}:1:")
    assert "not an NCCL topology file: XML error" in err


@pytest.mark.parametrize("data", [bytes(range(256)), b"\x7fELF\x02\x01\x01\x00\x00\x00",
                                  b"<system>\xff\xfe</system>"])
def test_import_of_a_binary_file_says_so(run_cli, tmp_path, data):
    binary = tmp_path / "topo.bin"
    binary.write_bytes(data)
    code, out, err = run_cli("import", binary)
    assert code == 2 and out == "" and "Traceback" not in err
    assert err.startswith(f"{binary}:1:")
    assert "a binary file, expected the XML text that NCCL_TOPO_DUMP_FILE writes" in err
