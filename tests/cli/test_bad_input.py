"""Every malformed input a newcomer found (issue 16) gets one clear error and exit status 2."""

from __future__ import annotations

import json

import pytest

from cclc.cli import main

TORUS = "topology t = torus(4) { link 32 GB/s, 100 ns }\n"
AG = TORUS + "collective a = allgather on t { size 1 MiB }\n"


def _write(tmp_path, text: str, name: str = "f.ccl"):
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return str(path)


def _fails(argv, capsys, *needles: str) -> str:
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    for needle in needles:
        assert needle in err, err
    return err


def _errors(argv, capsys, *needles: str) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    for needle in needles:
        assert needle in err, err
    return err


@pytest.fixture
def schedule(tmp_path) -> str:
    assert main(["compile", _write(tmp_path, AG), "-o", str(tmp_path / "out")]) == 0
    return str(tmp_path / "out" / "a.schedule.json")


def test_negative_seed_is_a_bad_flag(schedule, capsys):
    _fails(["verify", "--numeric", "--seed", "-1", schedule], capsys,
           "argument --seed: must be an integer >= 0, got -1")


def test_nccl_channels_zero_is_a_bad_flag(tmp_path, capsys):
    _fails(["tune", _write(tmp_path, AG), "-o", str(tmp_path / "t"), "--nccl-channels", "0"],
           capsys, "argument --nccl-channels: must be an integer in 1..64, got 0")


@pytest.mark.slow
@pytest.mark.parametrize("where, value, needle", [
    (("collective", "size"), 10**30, "outside the 64-bit range"),
    # one integer past 64 bits makes numpy read the whole list as floats
    (("ops", "count", 0), 2**63, "'ops.count' holds 9223372036854775808 at flat index 0: too "
                                 "large for the 64-bit integers"),
    (("ops", "count", 0), 2**64 + 5, "too large for the 64-bit integers"),
    (("layouts", "input", 0), -2**63 - 1, "too far below zero for the 64-bit integers"),
    (("topology", "links", "bandwidth", 0), float("inf"), "numbers must be finite"),
    (("topology", "links", "latency", 0), float("nan"), "numbers must be finite"),
    (("topology", "links", "bandwidth", 0), 1e-300, "link bandwidth must be > 0 and in 1..1e+15"),
    (("topology", "links", "latency", 0), 1e300, "link latency must be >= 0 and at most 1 s"),
])
@pytest.mark.parametrize("command", ["verify", "sim", "viz"])
def test_out_of_range_numbers_in_a_schedule(tmp_path, capsys, schedule, where, value, needle,
                                            command):
    doc = json.loads(open(schedule).read())
    parent = doc
    for key in where[:-1]:
        parent = parent[key]
    parent[where[-1]] = value
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(doc))
    argv = [command, str(bad)] + (["-o", str(tmp_path / "v.html")] if command == "viz" else [])
    _errors(argv, capsys, needle)


@pytest.mark.parametrize("link, needle", [
    ("link 1e-300 B/s, 100 ns", "a bandwidth must be between 1 B/s and 1 PB/s, got 1e-300 B/s"),
    ("link 1e9 TB/s, 100 ns", "a bandwidth must be between 1 B/s and 1 PB/s"),
    ("link 32 GB/s, 5 s", "a latency must be at most 1 s, got 5 s"),
])
def test_link_numbers_out_of_range(tmp_path, capsys, link, needle):
    src = _write(tmp_path, f"topology t = torus(4) {{ {link} }}\n"
                           "collective a = allreduce on t { size 1 MiB }\n")
    err = _errors(["compile", src, "-o", str(tmp_path / "out")], capsys, needle)
    assert "f.ccl:1:" in err and "inf" not in err.split("\n")[0].split("got")[0]


def test_unknown_algorithm_flag_is_reported_as_the_flag(tmp_path, capsys):
    err = _errors(["compile", _write(tmp_path, AG), "-o", str(tmp_path / "out"), "--algorithm",
                   "bogus"], capsys, "error: --algorithm bogus: unknown algorithm 'bogus'")
    assert "f.ccl:" not in err


def test_algorithm_flag_takes_no_parameters(tmp_path, capsys):
    _errors(["compile", _write(tmp_path, AG), "-o", str(tmp_path / "out"), "--algorithm",
             "halfring+pipeline(chunks=3)"], capsys, "without parameters",
            "write parameters in the file")


def test_bad_hint_parameter_is_reported_at_the_hint_before_writing(tmp_path, capsys):
    src = _write(tmp_path, TORUS + "collective a = allgather on t "
                                   "{ size 1 MiB; algorithm pat(buffer = 0 B) }\n")
    _errors(["compile", src, "-o", str(tmp_path / "out")], capsys,
            "f.ccl:2:", "parameter buffer must be an integer >= 1, got 0")
    assert not (tmp_path / "out").exists()


def test_duplicated_fault_line(tmp_path, capsys):
    src = _write(tmp_path, "topology t = torus(4, 4) { link 32 GB/s, 100 ns\n"
                           "  fault link (0,0) -- (0,1)\n"
                           "  fault link (0,1) -- (0,0)\n}\n")
    _errors(["check", src], capsys, "f.ccl:3:", "duplicate fault: this link already failed on "
                                                "line 2")


def test_duplicated_fault_rank(tmp_path, capsys):
    src = _write(tmp_path, "topology t = torus(4, 4) { link 32 GB/s, 100 ns\n"
                           "  fault rank (1,1)\n  fault rank (1,1)\n}\n")
    _errors(["check", src], capsys, "f.ccl:3:", "this rank already failed on line 2")


def test_full_width_digits(tmp_path, capsys):
    src = _write(tmp_path, TORUS + "collective a = allgather on t { size １６ MiB }\n")
    _errors(["check", src], capsys, "f.ccl:2:38: error: unexpected character '１' (U+FF11 "
            "FULLWIDTH DIGIT ONE) where only ASCII is allowed; expected a number")


@pytest.mark.parametrize("command", [["check"], ["bounds", "--no-lp"],
                                     ["compile", "-o", "{out}"]])
def test_a_byte_order_mark_is_accepted(tmp_path, capsys, command):
    path = tmp_path / "bom.ccl"
    path.write_bytes(b"\xef\xbb\xbf" + AG.encode())
    argv = [part.format(out=tmp_path / "out") for part in command] + [str(path)]
    assert main(argv) == 0, capsys.readouterr().err


def test_tune_reads_a_file_with_a_byte_order_mark(tmp_path, capsys):
    path = tmp_path / "bom.ccl"
    path.write_bytes(b"\xef\xbb\xbf" + AG.encode())
    # it reads the file and then finds nothing NCCL could tune on a torus
    _errors(["tune", str(path), "-o", str(tmp_path / "tune"), "--no-build"], capsys,
            "topology 't' is a torus")


def test_an_error_after_a_byte_order_mark_is_placed_and_echoed(tmp_path, capsys):
    path = tmp_path / "bom.ccl"
    path.write_bytes(b"\xef\xbb\xbf" + TORUS.replace("32", "3 2").encode())
    err = _errors(["check", str(path)], capsys, "bom.ccl:1:32: error:")
    assert err.splitlines()[1:] == [TORUS.replace("32", "3 2").rstrip(), " " * 31 + "^"]


def test_a_non_ascii_letter_is_named_and_echoed(tmp_path, capsys):
    src = _write(tmp_path, TORUS + "collective a = allgather on t { size 1 МiB }\n")
    err = _errors(["compile", src, "-o", str(tmp_path / "out")], capsys,
                  "f.ccl:2:40: error: unexpected character 'М' (U+041C CYRILLIC CAPITAL "
                  "LETTER EM)")
    assert err.splitlines()[1:] == ["collective a = allgather on t { size 1 МiB }",
                                    " " * 39 + "^"]


def test_bytes_that_are_not_utf8_are_an_error_with_a_place(tmp_path, capsys):
    path = tmp_path / "latin1.ccl"
    path.write_bytes(TORUS.replace("100 ns", "1 \xb5s").encode("latin-1"))
    err = _errors(["check", str(path)], capsys, "latin1.ccl:1:41: error: the file is not UTF-8 "
                  "text: byte 0xB5")
    assert err.splitlines()[2] == " " * 40 + "^"


def test_a_pinned_algorithm_is_not_called_chosen(tmp_path, capsys):
    src = _write(tmp_path, TORUS + "collective a = allgather on t "
                                   "{ size 1 MiB; algorithm ring }\n")
    assert main(["compile", src, "-o", str(tmp_path / "out"), "--explain"]) == 0
    table = capsys.readouterr().out
    ring = next(line for line in table.splitlines() if line.strip().startswith("ring "))
    assert "pinned by the file" in ring and "biring" in ring and "chosen" not in table


def test_advice_names_only_candidates_that_apply(tmp_path, capsys):
    src = _write(tmp_path, "topology pod = torus(4, 4) { link 50 GB/s, 100 ns\n"
                           "  fault rank (1,2) }\n"
                           "collective c = allreduce on pod.ranks[0, 1, 4, 5] { size 8 MiB }\n")
    assert main(["compile", src, "-o", str(tmp_path / "out"), "--explain"]) == 0
    table = capsys.readouterr().out
    direct = next(line for line in table.splitlines() if line.strip().startswith("direct "))
    assert "use biring" in direct and "ring+dimrotation" not in direct


def test_check_names_rail_zero_as_a_rail(capsys):
    assert main(["check", "examples/hgx16_leafspine.ccl"]) == 0
    assert "group rail(0) = leaders" in capsys.readouterr().out


def test_hierarchical_note_does_not_claim_nvlink_only(tmp_path, capsys):
    assert main(["compile", _write(tmp_path, AG), "-o", str(tmp_path / "o"), "--explain"]) == 0
    note = next(line for line in capsys.readouterr().out.splitlines() if "hierarchical" in line)
    assert "NVLink or PCIe" in note



@pytest.mark.parametrize("command", [["compile"], ["tune"]])
def test_empty_output_folder_name_is_a_bad_flag(tmp_path, capsys, monkeypatch, command):
    # Path("") is the current folder: writing there was never what -o '' meant
    source = _write(tmp_path, AG)
    monkeypatch.chdir(tmp_path)
    _fails([*command, source, "-o", ""], capsys, "argument -o/--output: expected a path, got an "
           "empty name")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f.ccl"]


@pytest.mark.parametrize("text", ["", "  \n# nothing yet\n"])
def test_a_file_that_declares_nothing_is_an_error(tmp_path, capsys, text):
    source = _write(tmp_path, text)
    _errors(["check", source], capsys, f"{source}:1:1: error: the file declares nothing")
    _errors(["compile", source, "-o", str(tmp_path / "out")], capsys,
            f"{source}:1:1: error: the file declares nothing")
    assert not (tmp_path / "out").exists()


def test_a_number_of_100000_digits(tmp_path, capsys):
    source = _write(tmp_path, "topology t = torus(" + "9" * 100_000 + ") { link 1 GB/s, 1 us }")
    for argv in (["check", source], ["compile", source, "-o", str(tmp_path / "out")]):
        err = _errors(argv, capsys, f"{source}:1:20: error: number too large")
        assert "\n" + " " * 19 + "^~~" in err
    assert not (tmp_path / "out").exists()


def test_an_ascii_terminal_gets_escapes_not_a_traceback(tmp_path, monkeypatch):
    import io
    import sys

    src = _write(tmp_path, TORUS + "collective a = allgather on t { size 1 МiB }\n", "тор.ccl")
    out, err = io.BytesIO(), io.BytesIO()
    monkeypatch.setattr(sys, "stdout", io.TextIOWrapper(out, encoding="ascii"))
    monkeypatch.setattr(sys, "stderr", io.TextIOWrapper(err, encoding="ascii"))
    assert main(["check", src]) == 2
    sys.stderr.flush()
    shown = err.getvalue().decode("ascii")
    assert "\\u0442\\u043e\\u0440.ccl:2:40: error: unexpected character '\\u041c'" in shown
    assert "Traceback" not in shown


def test_running_out_of_memory_is_a_sentence_not_a_traceback(tmp_path, capsys, monkeypatch):
    # the size check's estimates keep what would not fit out; one that falls short must still
    # end the compile with exit 2 and a message, whatever stage ran out
    import cclc.commands.compile as compile_command

    def exhausted(*args, **kwargs):
        raise MemoryError("Unable to allocate 16.0 GiB for an array")

    monkeypatch.setattr(compile_command, "compile_program", exhausted)
    source = _write(tmp_path, "topology t = torus(4) { link 50 GB/s, 100 ns }\n"
                              "collective c = allgather on t { size 1 MiB }\n")
    _errors(["compile", source, "-o", str(tmp_path / "out")], capsys,
            "ran out of memory (Unable to allocate 16.0 GiB", "size check")
