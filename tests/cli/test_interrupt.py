"""Ctrl-C in the first seconds of ``cclc``, while it imports numpy, lark and OR-Tools: the
command says "interrupted" and exits 130, never with a traceback."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cclc import cli

ROOT = Path(__file__).resolve().parents[2]

# what the console script ``cclc`` (pyproject.toml: cclc.cli:program) runs
ENTRY = "from cclc.cli import program; program()"

SOURCE = """
topology t = torus(3, 3) { link 32 GB/s, 100 ns }
collective a2a = alltoall on t { size 9 KiB }
"""


@pytest.mark.skipif(not hasattr(signal, "SIGINT"), reason="needs POSIX signals")
@pytest.mark.parametrize("delay", [0.05, 0.2, 0.5, 1.0])
def test_ctrl_c_while_importing_says_interrupted(tmp_path, delay):
    source = tmp_path / "t.ccl"
    source.write_text(SOURCE)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT),
                                                       os.environ.get("PYTHONPATH", "")]))
    # -X importtime reports each module as it finishes importing: the delays count from the
    # moment cclc.cli is imported, since a Ctrl-C in Python's own start-up (site and its .pth
    # files, before any cclc code runs) is Python's to report
    proc = subprocess.Popen([sys.executable, "-X", "importtime", "-c", ENTRY, "compile",
                             str(source), "-o", str(tmp_path / "out")], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None
    seen = []
    for line in proc.stderr:
        seen.append(line)
        if line.rstrip().endswith("| cclc.cli"):
            break
    else:
        raise AssertionError("cclc.cli was never imported:\n" + "".join(seen))
    time.sleep(delay)
    proc.send_signal(signal.SIGINT)
    _, rest = proc.communicate(timeout=120)
    err = "".join(line for line in (seen + rest.splitlines(keepends=True))
                  if not line.startswith("import time:"))
    assert "Traceback" not in err, err
    # a run that finished before the signal came exits as it would have
    assert proc.returncode in (130, 0), err
    if proc.returncode == 130:
        assert err.rstrip().endswith("interrupted"), err


def test_an_interrupt_an_extension_turned_into_another_error_says_interrupted(monkeypatch,
                                                                             capsys):
    """numpy's C core, interrupted while it initializes, raises ImportError ("PyCapsule_Import
    could not import module 'datetime'") from the KeyboardInterrupt: still 'interrupted'; the
    same error without a Ctrl-C is not hidden."""
    def interrupted_import(argv, own_process):
        try:
            cli._on_sigint(signal.SIGINT, None)
        except KeyboardInterrupt as exc:
            raise ImportError('PyCapsule_Import could not import module "datetime"') from exc

    def failed_import(argv, own_process):
        raise ImportError("no module named numpy")

    before = signal.getsignal(signal.SIGINT)
    try:
        monkeypatch.setattr(cli, "_run", interrupted_import)
        assert cli.main([]) == 130
        assert capsys.readouterr().err.strip() == "interrupted"
        monkeypatch.setattr(cli, "_run", failed_import)
        with pytest.raises(ImportError, match="numpy"):
            cli.main([])
    finally:
        signal.signal(signal.SIGINT, before)
