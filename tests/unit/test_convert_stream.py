"""Streaming HF -> Megatron conversion (``convert/stream.py``) against the model-built reference.

* the derived layout equals ``GPTModel.sharded_state_dict(prefix="")`` of a built tiny model (keys,
  global shapes, offsets, chunk sizes; every entry a main replica, no flattened ranges);
* the streamed checkpoint equals ``dist_checkpointing.save`` of the built model: same DCP metadata
  (keys, dtypes, global shapes, chunks) and bit-identical records, same common.pt / metadata.json /
  hf config — for Llama / Qwen2 / Qwen3, tied and untied, fp32 and bf16 sources, through the
  zero-copy (``copy_file_range``), the materialising and the pread/pwrite fallback paths;
* bad input raises naming the tensor and leaves nothing behind.

The reference runs in a subprocess (this file, run as a script), since it patches torch for megatron.
"""
from __future__ import annotations

import errno
import io
import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[2]
CASES = {
    "llama_untied": ("LlamaForCausalLM", "LlamaConfig", dict(tie_word_embeddings=False), torch.float32),
    "llama_tied": ("LlamaForCausalLM", "LlamaConfig", dict(tie_word_embeddings=True), torch.float32),
    "qwen2_untied": ("Qwen2ForCausalLM", "Qwen2Config", dict(tie_word_embeddings=False), torch.float32),
    "qwen2_tied": ("Qwen2ForCausalLM", "Qwen2Config", dict(tie_word_embeddings=True), torch.float32),
    "qwen3_untied": ("Qwen3ForCausalLM", "Qwen3Config", dict(head_dim=32, tie_word_embeddings=False), torch.float32),
    "qwen3_tied_bf16": ("Qwen3ForCausalLM", "Qwen3Config", dict(head_dim=32, tie_word_embeddings=True), torch.bfloat16),
}


def make_hf(case: str, out: Path) -> Path:
    import transformers

    arch, cfg_cls, kw, dtype = CASES[case]
    cfg = getattr(transformers, cfg_cls)(vocab_size=100, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                         rms_norm_eps=1e-6, architectures=[arch], **kw)
    torch.manual_seed(0)
    m = getattr(transformers, arch)(cfg)
    with torch.no_grad():
        for p in m.parameters():
            p.copy_(torch.randn_like(p))
    m.to(dtype).save_pretrained(str(out))
    return out


def _reference_main(hf_dir: str, ckpt: str, dump: str) -> None:
    """Subprocess (once per argv triple): build the model at TP=PP=1, dump its sharded state dict, convert
    the old way."""
    from megatron.core.dist_checkpointing.dict_utils import nested_values
    from megatron.core.dist_checkpointing.mapping import ShardedObject, ShardedTensor, apply_factories

    from megatron_rl.convert.checkpoints import hf_to_mcore
    from megatron_rl.models.provider import build_gpt_model, load_hf_config, transformer_config_from_hf
    from megatron_rl.runtime.parallel import init_parallel

    init_parallel(1, 1, seed=0)
    cfg = load_hf_config(hf_dir)
    sd = build_gpt_model(cfg, transformer_config_from_hf(cfg, perform_initialization=False)).sharded_state_dict(prefix="")
    apply_factories(sd)
    rows = []
    for v in nested_values(sd):
        rid = list(v.replica_id) if isinstance(v.replica_id, tuple) else [v.replica_id]
        if isinstance(v, ShardedTensor):
            rows.append(dict(kind="tensor", key=v.key, global_shape=list(v.global_shape), offsets=list(v.global_offset),
                             sizes=[1] * v.prepend_axis_num + list(v.local_shape), replica_id=rid,
                             flattened=v.flattened_range is not None, dtype=str(v.dtype)))
        elif isinstance(v, ShardedObject):
            rows.append(dict(kind="object", key=v.unique_key, replica_id=rid))
        else:
            rows.append(dict(kind=type(v).__name__))
    Path(dump).write_text(json.dumps(rows))
    hf_to_mcore(hf_dir, ckpt, engine="model")


@pytest.fixture(scope="module")
def references(tmp_path_factory) -> dict:
    """(hf dir, model-built checkpoint, sharded-state-dict dump) of every case, built in ONE subprocess
    (imports and megatron set-up once, not once per case)."""
    root = tmp_path_factory.mktemp("refs")
    hfs = {c: make_hf(c, root / c / "hf") for c in CASES}
    argv = [str(x) for c in CASES for x in (hfs[c], root / c / "ref", root / c / "dump.json")]
    p = subprocess.run([sys.executable, __file__, *argv], cwd=REPO, capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stderr[-4000:]
    return {c: (hfs[c], root / c / "ref", json.loads((root / c / "dump.json").read_text())) for c in CASES}


@pytest.fixture(params=list(CASES))
def case(request, references):
    """(hf dir, model-built checkpoint, sharded-state-dict dump) of one tiny model."""
    return references[request.param]


def _records(dist_dir: Path) -> tuple[object, dict]:
    md = pickle.loads((dist_dir / ".metadata").read_bytes())
    out = {}
    for idx, si in md.storage_data.items():
        with open(dist_dir / si.relative_path, "rb") as f:
            f.seek(si.offset)
            raw = f.read(si.length)
        off = None if idx.offset is None else tuple(idx.offset)
        out[(idx.fqn, off)] = torch.load(io.BytesIO(raw), weights_only=False)
    return md, out


def assert_same_checkpoint(ref: Path, new: Path) -> None:
    a_md, a = _records(ref / "dist")
    b_md, b = _records(new / "dist")
    assert a_md.state_dict_metadata == b_md.state_dict_metadata
    assert set(a) == set(b)
    for k, v in a.items():
        if isinstance(v, torch.Tensor):
            assert v.dtype == b[k].dtype and v.shape == b[k].shape and torch.equal(v, b[k]), k
        else:
            assert v == b[k], k
    assert torch.load(ref / "dist/common.pt") == torch.load(new / "dist/common.pt")
    assert json.loads((ref / "dist/metadata.json").read_text()) == json.loads((new / "dist/metadata.json").read_text())
    from megatron_rl.models.provider import load_hf_config

    # the reference re-saves the config through transformers, streaming copies it as given: same config
    strip = lambda c: {k: v for k, v in c.to_dict().items() if k != "transformers_version"}  # noqa: E731
    assert strip(load_hf_config(ref / "hf")) == strip(load_hf_config(new / "hf"))
    ca, cb = json.loads((ref / "COMPLETE").read_text()), json.loads((new / "COMPLETE").read_text())
    assert {k: v for k, v in ca.items() if k != "source"} == {k: v for k, v in cb.items() if k != "source"}
    assert sorted(p.name for p in (ref / "hf").iterdir()) == sorted(p.name for p in (new / "hf").iterdir())


def test_layout_equals_model_sharded_state_dict(case):
    from megatron_rl.convert.mcore_layout import mcore_layout
    from megatron_rl.models.provider import model_arch_info

    hf, _, rows = case
    chunks, objects = mcore_layout(model_arch_info(hf))
    assert all(r["kind"] in ("tensor", "object") for r in rows), {r["kind"] for r in rows}
    assert all(set(r["replica_id"]) == {0} for r in rows), "TP=1 model: every entry is a main replica"
    assert not any(r.get("flattened") for r in rows)
    want = sorted((r["key"], tuple(r["global_shape"]), tuple(r["offsets"]), tuple(r["sizes"]))
                  for r in rows if r["kind"] == "tensor")
    got = sorted((c.key, c.global_shape, c.offsets, c.sizes) for c in chunks)
    assert got == want
    assert sorted(o.key for o in objects) == sorted(r["key"] for r in rows if r["kind"] == "object")


@pytest.mark.parametrize("path", ["zero_copy", "materialise", "pread_fallback"])
def test_streamed_checkpoint_equals_model_built(case, path, tmp_path, monkeypatch):
    from megatron_rl.convert import dcp_writer
    from megatron_rl.convert.stream import hf_to_mcore_streaming

    hf, ref, _ = case
    if path != "materialise":
        monkeypatch.setattr(dcp_writer, "SMALL_RECORD", 0)  # tiny tensors through the byte-copy path
        monkeypatch.setattr(dcp_writer, "CAST_BLOCK", 1000)  # bf16 -> fp32 casts in several blocks
    if path == "pread_fallback":
        def no_kernel_copy(*a, **k):
            raise OSError(errno.EXDEV, "cross-device")
        monkeypatch.setattr(os, "copy_file_range", no_kernel_copy)
    out = hf_to_mcore_streaming(hf, tmp_path / "mc")
    assert_same_checkpoint(ref, out)
    assert not list(tmp_path.glob(".tmp-*"))


@pytest.mark.parametrize("path", ["byte_copy", "assembled"])
def test_round_trip_to_hf_is_bit_identical(case, path, tmp_path, monkeypatch):
    """hf -> mcore -> hf through the streamed checkpoint and through megatron's own
    ``dist_checkpointing.save`` of the built model: every tensor of the export equals the source
    file's as file content (dtype, shape, bytes) — fp32 and bf16 sources, tied and untied; the stored
    checkpoint keeps the source dtype, config.json names it; several shards + index load with
    safetensors itself. ``assembled``: every tensor through the in-memory path instead of byte copies."""
    from safetensors import safe_open

    from megatron_rl.convert import export
    from megatron_rl.convert.checkpoints import mcore_to_hf
    from megatron_rl.convert.dcp_reader import DcpReader
    from megatron_rl.convert.safetensors_index import SafetensorsIndex, diff_tensors
    from megatron_rl.convert.stream import hf_to_mcore_streaming

    hf, ref, _ = case
    src_dtype = SafetensorsIndex(hf)["model.embed_tokens.weight"].dtype
    if path == "assembled":
        monkeypatch.setattr(export, "copy_rule", lambda *a: False)
    mc = hf_to_mcore_streaming(hf, tmp_path / "mc")
    with DcpReader(mc / "dist") as r:
        assert {r.dtype(k) for k in r.tensor_keys()} == {src_dtype}
    for name, ckpt in (("streamed", mc), ("model_built", ref)):
        out = mcore_to_hf(ckpt, tmp_path / f"hf_{name}", max_shard_bytes=60_000)
        n, bad = diff_tensors(hf, out)
        assert n > 10 and bad == [], (name, bad)
        assert json.loads((out / "config.json").read_text())["dtype"] == str(src_dtype).removeprefix("torch.")
        files = sorted(out.glob("*.safetensors"))
        assert len(files) > 1 and (out / "model.safetensors.index.json").is_file()
        for f in files:
            with safe_open(str(f), "pt") as h:
                assert all(h.get_tensor(k).dtype == src_dtype for k in h.keys())  # noqa: SIM118
    assert not list(tmp_path.glob(".tmp-*"))


@pytest.mark.parametrize("case", ["qwen3_tied_bf16"], indirect=True)
def test_export_dtype_is_chosen_and_named(case, tmp_path):
    """``--dtype float32`` of a bf16 checkpoint: fp32 tensors equal to the bf16 values, config.json
    says float32; an unknown dtype is refused in one line before anything is written."""
    from safetensors.torch import load_file

    from megatron_rl.convert.cli import main as cli
    from megatron_rl.convert.stream import hf_to_mcore_streaming

    hf = case[0]
    mc = hf_to_mcore_streaming(hf, tmp_path / "mc")
    assert cli(["mcore-to-hf", "--ckpt", str(mc), "--out", str(tmp_path / "f32"), "--dtype", "float32"]) == 0
    a, b = load_file(str(hf / "model.safetensors")), load_file(str(tmp_path / "f32" / "model.safetensors"))
    assert all(b[k].dtype == torch.float32 and torch.equal(b[k], a[k].float()) for k in b)
    assert json.loads((tmp_path / "f32" / "config.json").read_text())["dtype"] == "float32"
    p = subprocess.run([sys.executable, "-m", "megatron_rl.convert.cli", "mcore-to-hf", "--ckpt", str(mc), "--out",
                        str(tmp_path / "x"), "--dtype", "int8"], check=False, cwd=REPO, capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 2 and "invalid choice: 'int8'" in p.stderr and not (tmp_path / "x").exists()


@pytest.mark.parametrize("case", ["llama_untied"], indirect=True)
def test_export_of_a_damaged_checkpoint_fails_in_one_line(case, tmp_path, capsys):
    """A truncated ``.distcp`` record or a missing ``.metadata``: exit status 2, one line naming the
    file, no output dir and no temp dir left."""
    import shutil

    from megatron_rl.convert.cli import main as cli
    from megatron_rl.convert.stream import hf_to_mcore_streaming

    mc = hf_to_mcore_streaming(case[0], tmp_path / "mc")
    for damage in ("cut", "no_metadata"):
        bad = tmp_path / damage
        shutil.copytree(mc, bad)
        if damage == "cut":
            f = max((bad / "dist").glob("*.distcp"), key=lambda p: p.stat().st_size)
            f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])
        else:
            (bad / "dist" / ".metadata").unlink()
        rc = cli(["mcore-to-hf", "--ckpt", str(bad), "--out", str(tmp_path / f"out_{damage}")])
        stderr = capsys.readouterr().err
        err = [ln for ln in stderr.splitlines() if "megatron-rl convert: error:" in ln]
        assert rc == 2 and len(err) == 1 and len(stderr.strip().splitlines()) == 1, stderr[-2000:]
        assert ("corrupt checkpoint" if damage == "cut" else ".metadata missing") in err[0], err
        assert not (tmp_path / f"out_{damage}").exists() and not list(tmp_path.glob(".tmp-*"))


def _save_variant(src: Path, dst: Path, edit) -> Path:
    import shutil

    from safetensors.torch import load_file, save_file

    shutil.copytree(src, dst)
    w = load_file(str(src / "model.safetensors"))
    save_file(edit(dict(w)), str(dst / "model.safetensors"))
    return dst


@pytest.mark.parametrize("case", ["qwen3_untied"], indirect=True)
def test_bad_input_names_the_tensor_and_leaves_nothing(case, tmp_path):
    from megatron_rl.convert.stream import hf_to_mcore_streaming

    hf = case[0]
    miss = _save_variant(hf, tmp_path / "miss", lambda w: {k: v for k, v in w.items() if "layers.1.mlp.up_proj" not in k})
    with pytest.raises(KeyError, match="model.layers.1.mlp.up_proj.weight"):
        hf_to_mcore_streaming(miss, tmp_path / "o1")
    extra = _save_variant(hf, tmp_path / "extra", lambda w: {**w, "model.layers.0.mystery.weight": torch.zeros(2)})
    with pytest.raises(ValueError, match="mystery"):
        hf_to_mcore_streaming(extra, tmp_path / "o2")
    shape = _save_variant(hf, tmp_path / "shape", lambda w: {**w, "model.layers.0.self_attn.k_proj.weight": torch.zeros(8, 64)})
    with pytest.raises(ValueError, match=r"model.layers.0.self_attn.k_proj.weight.*\(8, 64\)"):
        hf_to_mcore_streaming(shape, tmp_path / "o3")
    cut = _save_variant(hf, tmp_path / "cut", lambda w: w)
    raw = (cut / "model.safetensors").read_bytes()
    (cut / "model.safetensors").write_bytes(raw[: len(raw) - 1000])
    with pytest.raises(ValueError, match="corrupt safetensors file"):
        hf_to_mcore_streaming(cut, tmp_path / "o4")
    for i in range(1, 5):
        assert not (tmp_path / f"o{i}").exists()
    assert not list(tmp_path.glob(".tmp-*")), "half-written output left behind"
    out = hf_to_mcore_streaming(hf, tmp_path / "ok")
    with pytest.raises(FileExistsError, match="--force"):
        hf_to_mcore_streaming(hf, out)
    assert hf_to_mcore_streaming(hf, out, force=True) == out and (out / "COMPLETE").is_file()
    assert not list(tmp_path.glob(".tmp-*"))


def test_write_failure_midway_leaves_nothing(tmp_path, monkeypatch):
    from megatron_rl.convert import dcp_writer
    from megatron_rl.convert.stream import hf_to_mcore_streaming

    hf = make_hf("llama_untied", tmp_path / "hf")
    calls = []

    def boom(self, chunk, _orig=dcp_writer.DcpFileWriter.write_chunk):
        calls.append(chunk.key)
        if len(calls) == 5:
            raise OSError(errno.ENOSPC, "No space left on device")
        return _orig(self, chunk)

    monkeypatch.setattr(dcp_writer.DcpFileWriter, "write_chunk", boom)
    from megatron_rl.runtime.diskspace import DiskSpaceError

    with pytest.raises(DiskSpaceError, match=r"^disk full while writing \S+/out \(\d+ bytes free now\): the partial output "
                                             "was removed") as e:    # one line (diskspace.py), the cause kept
        hf_to_mcore_streaming(hf, tmp_path / "out")
    assert "\n" not in str(e.value) and "No space" in str(e.value.__cause__)
    assert not (tmp_path / "out").exists() and not list(tmp_path.glob(".tmp-*"))


@pytest.mark.parametrize("drop", [(), ("head_dim",), ("num_key_value_heads",), ("tie_word_embeddings",),
                                  ("max_position_embeddings", "rope_theta")])
@pytest.mark.parametrize("name", ["llama_untied", "qwen2_tied", "qwen3_untied"])
def test_arch_from_json_equals_transformers(name, drop, tmp_path):
    from megatron_rl.convert.config_json import arch_info
    from megatron_rl.models.provider import model_arch_info

    arch, cfg_cls, kw, _ = CASES[name]
    d = {"model_type": arch[:-len("ForCausalLM")].lower(), "architectures": [arch], "vocab_size": 100,
         "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2, "num_attention_heads": 4,
         "num_key_value_heads": 2, "rms_norm_eps": 1e-6, "rope_theta": 5e5, "max_position_embeddings": 64, **kw}
    if name != "llama_untied" and "num_key_value_heads" in drop:
        d["num_attention_heads"] = 64  # HF's default of 32 KV heads must divide it
    for k in drop:
        d.pop(k, None)
    (tmp_path / "config.json").write_text(json.dumps(d))
    fast, from_json = arch_info(tmp_path)
    assert from_json and fast == model_arch_info(tmp_path)
    d.pop("vocab_size")
    (tmp_path / "config.json").write_text(json.dumps(d))
    assert arch_info(tmp_path)[1] is False  # falls back to transformers


_RSS = """
import resource, sys, torch.distributed.checkpoint
from megatron_rl.convert.stream import hf_to_mcore_streaming
if sys.argv[1] != "-":
    hf_to_mcore_streaming(sys.argv[1], sys.argv[2])
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
"""


def test_peak_memory_does_not_grow_with_the_model(tmp_path):
    """A bf16 checkpoint with 131 MB embedding / lm_head tensors (262 MB each in fp32): the streaming
    converter's peak RSS stays within a few cast blocks of an import-only process."""
    from safetensors.torch import save_file

    h, v, f, layers = 1024, 64000, 2048, 2
    cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": h, "intermediate_size": f,
           "num_hidden_layers": layers, "num_attention_heads": 8, "num_key_value_heads": 4, "vocab_size": v,
           "rms_norm_eps": 1e-5, "tie_word_embeddings": False}
    hf = tmp_path / "hf"
    hf.mkdir()
    (hf / "config.json").write_text(json.dumps(cfg))
    w = lambda *s: torch.ones(*s, dtype=torch.bfloat16)  # noqa: E731
    save_file({"model.embed_tokens.weight": w(v, h), "lm_head.weight": w(v, h), "model.norm.weight": w(h)},
              str(hf / "model-1.safetensors"))
    t = {}
    for i in range(layers):
        p = f"model.layers.{i}."
        t.update({p + "self_attn.q_proj.weight": w(h, h), p + "self_attn.k_proj.weight": w(h // 2, h),
                  p + "self_attn.v_proj.weight": w(h // 2, h), p + "self_attn.o_proj.weight": w(h, h),
                  p + "mlp.gate_proj.weight": w(f, h), p + "mlp.up_proj.weight": w(f, h),
                  p + "mlp.down_proj.weight": w(h, f), p + "input_layernorm.weight": w(h),
                  p + "post_attention_layernorm.weight": w(h)})
    save_file(t, str(hf / "model-2.safetensors"))
    del t

    def peak(*args) -> int:
        p = subprocess.run([sys.executable, "-c", _RSS, *map(str, args)], cwd=REPO, capture_output=True, text=True,
                           timeout=600)
        assert p.returncode == 0, p.stderr[-3000:]
        return int(p.stdout.split()[-1])

    base, conv = peak("-"), peak(hf, tmp_path / "mc")
    assert (tmp_path / "mc" / "COMPLETE").is_file()
    assert conv - base < 100e6, f"streaming conversion grew RSS by {(conv - base) / 1e6:.0f} MB"


def test_frame_plus_raw_bytes_is_torch_save():
    from megatron_rl.convert.dcp_writer import tensor_frame

    for shape, dtype in (((3, 5, 7), torch.float32), ((1, 600, 512), torch.bfloat16), ((4096,), torch.float16)):
        t = torch.randn(shape).to(dtype)
        pre, suf = tensor_frame(shape, dtype)
        back = torch.load(io.BytesIO(pre + t.reshape(-1).view(torch.uint8).numpy().tobytes() + suf), weights_only=True)
        assert back.dtype == dtype and back.shape == t.shape and torch.equal(back, t)


if __name__ == "__main__":
    for i in range(1, len(sys.argv), 3):
        _reference_main(*sys.argv[i:i + 3])
