"""Name maps and transforms (pure), and bad input through the real CLI (subprocesses)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from megatron_rl.convert import name_maps, transforms
from megatron_rl.models.provider import model_arch_info

REPO = Path(__file__).resolve().parents[3]


@pytest.mark.parametrize("nh,nkv,d", [(4, 2, 8), (8, 8, 4), (6, 1, 4), (8, 2, 16)])
def test_qkv_and_gate_up_are_inverse_and_grouped(nh, nkv, d):
    q, k, v = torch.randn(nh * d, 5), torch.randn(nkv * d, 5), torch.randn(nkv * d, 5)
    fused = transforms.fuse_qkv(q, k, v, nh, nkv, d)
    assert fused.shape == ((nh + 2 * nkv) * d, 5)
    # group 0 = q rows of its heads, then k head 0, then v head 0
    per = nh // nkv * d
    assert torch.equal(fused[:per], q[:per]) and torch.equal(fused[per:per + d], k[:d])
    assert all(torch.equal(a, b) for a, b in zip(transforms.split_qkv(fused, nh, nkv, d), (q, k, v)))
    g, u = torch.randn(12, 5), torch.randn(12, 5)
    assert all(torch.equal(a, b) for a, b in zip(transforms.split_gate_up(transforms.fuse_gate_up(g, u)), (g, u)))


@pytest.mark.parametrize("kind,transform", [("col", "identity"), ("col", "qkv"), ("col", "gate_up"), ("row", "identity"),
                                            ("vocab", "identity"), ("rep", "identity")])
def test_shard_unshard_inverse(kind, transform):
    full = torch.randn(16, 8)
    tp = 2
    shards = [transforms.shard(full, kind, transform, tp, r, padded_rows=20 if kind == "vocab" else None) for r in range(tp)]
    if kind == "gate_up":
        pass
    back = transforms.unshard(shards, kind, transform, vocab_size=16)
    assert torch.equal(back, full)
    if transform == "gate_up":  # rank r holds [gate_r; up_r]
        assert torch.equal(shards[1], torch.cat([full[4:8], full[12:16]]))


def test_name_maps_cover_each_architecture():
    base = dict(vocab_size=100, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, rms_norm_eps=1e-6)
    for mt, arch, extra in (("llama", "LlamaForCausalLM", set()), ("qwen2", "Qwen2ForCausalLM", {"q_proj.bias"}),
                            ("qwen3", "Qwen3ForCausalLM", {"q_norm.weight"})):
        for tied in (True, False):
            a = model_arch_info({"model_type": mt, "architectures": [arch], "tie_word_embeddings": tied, **base})
            names = name_maps.expected_hf_names(a)
            assert ("lm_head.weight" in names) is (not tied)
            assert all(any(n.endswith(e) for n in names) for e in extra)
            assert len({r.mcore for r in name_maps.expand(a)}) == len(name_maps.expand(a))


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "megatron_rl.convert.cli", *map(str, args)], capture_output=True,
                          text=True, timeout=300, cwd=REPO)


def _copy(src: Path, dst: Path) -> Path:
    import shutil

    shutil.copytree(src, dst)
    return dst


def test_bad_inputs_fail_clearly_and_leave_nothing(hf_dir, tmp_path):
    from safetensors.torch import load_file, save_file

    # unknown architecture
    bad = _copy(hf_dir, tmp_path / "arch")
    c = json.loads((bad / "config.json").read_text())
    c.update(architectures=["GPT2LMHeadModel"], model_type="gpt2")
    (bad / "config.json").write_text(json.dumps(c))
    p = _cli("hf-to-mcore", "--hf", bad, "--out", tmp_path / "o1")
    assert p.returncode == 2 and "unsupported architecture 'GPT2LMHeadModel'" in p.stderr
    # missing and extra tensors
    w = load_file(str(hf_dir / "model.safetensors"))
    miss = _copy(hf_dir, tmp_path / "miss")
    save_file({k: v for k, v in w.items() if "layers.1.mlp.down_proj" not in k}, str(miss / "model.safetensors"))
    p = _cli("hf-to-mcore", "--hf", miss, "--out", tmp_path / "o2")
    assert p.returncode == 2 and "missing" in p.stderr and "model.layers.1.mlp.down_proj.weight" in p.stderr
    extra = _copy(hf_dir, tmp_path / "extra")
    save_file({**w, "model.layers.0.mystery.weight": torch.zeros(2)}, str(extra / "model.safetensors"))
    p = _cli("hf-to-mcore", "--hf", extra, "--out", tmp_path / "o3")
    assert p.returncode == 2 and "unexpected" in p.stderr and "mystery" in p.stderr
    # heads not divisible by TP
    p = _cli("hf-to-mcore", "--hf", hf_dir, "--out", tmp_path / "o4", "--tp", "3")
    assert p.returncode == 2 and "not divisible by tensor parallel size 3" in p.stderr
    # corrupt (truncated) safetensors
    cor = _copy(hf_dir, tmp_path / "corrupt")
    raw = (cor / "model.safetensors").read_bytes()
    (cor / "model.safetensors").write_bytes(raw[: len(raw) // 2])
    p = _cli("hf-to-mcore", "--hf", cor, "--out", tmp_path / "o5")
    assert p.returncode == 2 and "corrupt safetensors file" in p.stderr
    for i in range(1, 6):
        assert not (tmp_path / f"o{i}").exists()
    assert not list(tmp_path.glob(".tmp-*")), "half-written output left behind"


def test_existing_output_refused_without_force(hf_dir, tmp_path):
    out = tmp_path / "mc"
    assert _cli("hf-to-mcore", "--hf", hf_dir, "--out", out).returncode == 0
    p = _cli("hf-to-mcore", "--hf", hf_dir, "--out", out)
    assert p.returncode == 2 and "already holds a checkpoint; pass --force" in p.stderr
    # quiet by default (issue 24): building the Megatron model logs ~14 lines of INFO (Megatron-FSDP, patches,
    # parallel state) and a deprecation warning; they go to OUT.convert.log, the console gets one line
    p = _cli("hf-to-mcore", "--hf", hf_dir, "--out", out, "--force", "--engine", "model")
    log = tmp_path / "mc.convert.log"
    assert p.returncode == 0 and p.stderr == "", p.stderr
    assert p.stdout.splitlines() == [f"wrote {out} (log: {log})"]
    assert "INFO megatron_rl.patches: patch" in log.read_text() and "UserWarning" in log.read_text()
    hf2 = tmp_path / "hf2"
    assert _cli("mcore-to-hf", "--ckpt", out, "--out", hf2).returncode == 0
    p = _cli("mcore-to-hf", "--ckpt", out, "--out", hf2)
    assert p.returncode == 2 and "--force" in p.stderr
    from transformers import AutoModelForCausalLM

    assert AutoModelForCausalLM.from_pretrained(str(hf2)) is not None
