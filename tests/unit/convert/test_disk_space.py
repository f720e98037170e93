"""``megatron-rl convert`` on a disk too small for its output (a real 64 KiB tmpfs): the free-space
check refuses before anything is written, with one ``error:`` line naming the path and the bytes
needed vs free, exit status 1 (a runtime error), and nothing left on the small file system.
Both directions, in-process through the real entry point ``megatron_rl.cli.main``."""
from __future__ import annotations

import re

from megatron_rl.cli import main
from tests.helpers.tmpfs import small_tmpfs


def _one_line(capsys, out_dir) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    line = err[0]
    assert line.startswith("megatron-rl convert: error: not enough free space for "), line
    m = re.search(r"in (\S+): needs (\d+) bytes \(.*\), (\d+) bytes \(.*\) free", line)
    assert m and m.group(1) == str(out_dir.parent) and int(m.group(2)) > int(m.group(3)), line
    return line


def test_convert_refuses_when_the_output_does_not_fit(hf_dir, tmp_path, capsys):
    from megatron_rl.convert.stream import hf_to_mcore_streaming

    weights = sum(f.stat().st_size for f in hf_dir.glob("*.safetensors"))
    ckpt = hf_to_mcore_streaming(hf_dir, tmp_path / "mc")         # on the roomy disk
    with small_tmpfs(tmp_path / "small", "64k") as small:
        out = small / "mcore"
        assert main(["convert", "hf-to-mcore", "--hf", str(hf_dir), "--out", str(out)]) == 1
        assert f"needs {weights} bytes" in _one_line(capsys, out)
        out = small / "hf_export"
        assert main(["convert", "mcore-to-hf", "--ckpt", str(ckpt), "--out", str(out)]) == 1
        assert "for the HF export hf_export" in _one_line(capsys, out)
        assert list(small.iterdir()) == []                          # nothing started
