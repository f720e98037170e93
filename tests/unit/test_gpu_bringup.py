"""The GPU bring-up (``tools/gpu_check.sh``), rehearsed on CPU in an environment that looks like the lent GPU
machine (``tests/helpers/lent_machine.py``: this checkout on ``PYTHONPATH``, not installed; no vLLM, Ray or
Transformer Engine importable): every stage runs end to end on a tiny model, so an import error, a moved
module or a stage that breaks fails here, not in the device minutes. Also: ``megatron_rl.patches`` imports
from a plain checkout and from an installed layout; local attention that cannot fit is refused at start-up.
(The script's bad-input refusals: ``tests/unit/test_launch_scripts.py``.)"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.dist import REPO, repo_env
from tests.helpers.lent_machine import lent_env
from tests.helpers.tools import load_tool

SCRIPT = REPO / "tools" / "gpu_check.sh"
STAGES = ["env", "checkpoint", "actor", "roundtrip", "parity", "train", "scores", "export", "offload", "ipc",
          "train_step", "mu_pass", "tests"]
RUNNER = REPO / "tools" / "gpu_check_run.py"


def _run(tmp: Path, extra: dict, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    env = lent_env(tmp, {"PYTHON": sys.executable, "OUT": str(tmp / "out"), "WORK": str(tmp / "work"), "WHEELS": "",
                         **extra})     # megatron-core from this environment (a cp312 wheel in .whl/ would not install)
    return subprocess.run(["bash", str(SCRIPT), *args], env=env, capture_output=True, text=True, timeout=timeout,
                          cwd=tmp)


def test_bringup_runs_end_to_end_on_the_lent_machines_packages(tmp_path):
    r = _run(tmp_path, {"GPU_CHECK_ALLOW_CPU": "1", "SHAPE": "tiny", "SEQ_LEN": "64", "ROWS": "2"},
             "--parity-len", "32", "--score-len", "32", "--bucket-mib", "1")
    rec = json.loads((tmp_path / "out" / "gpu_check.json").read_text())
    st = {s["stage"]: s for s in rec["stages"]}
    assert [s["stage"] for s in rec["stages"]] == STAGES, r.stdout[-3000:] + r.stderr[-3000:]
    assert r.returncode == 0 and all(s["ok"] for s in rec["stages"]), json.dumps(rec, indent=1)[-4000:]
    env = st["env"]
    assert env["stack"]["vllm"] is None and env["stack"]["ray"] is None and env["backend"] == "local"   # blocked
    assert env["c_compiler"] and env["python_h"] and env["nccl"] is None       # Triton's toolchain; no NCCL on CPU
    assert "No module named 'transformer_engine'" in env["transformer_engine"]
    assert "cpu_cuda_factories" in env["patches_applied"]
    assert st["roundtrip"]["tensors"] > 0 and st["export"]["tensors"] > 0
    # fp32 on one CPU: the same arithmetic up to summation order (HF transformers as the oracle)
    assert st["parity"]["fp32"]["max_abs"] <= 1e-5 and st["parity"]["bf16"]["max_abs"] <= st["parity"]["bf16"]["tol_max"]
    assert len(st["train"]["losses"]) == 3 and st["train"]["tokens_per_s"] > 0 and st["train"]["plan_attention"] == "local"
    assert st["train"]["mfu"] is None and st["train"]["peak_allocated_gib"] == 0       # no device here: no MFU, no peak
    # megatron's local attention keeps 6 B per S x S element in bf16, as plan says (+ each layer's boolean causal
    # mask, s x s shared by the 4 heads: 1/4 B per element)
    assert st["scores"]["bytes_per_score_plan"] == 6 and abs(st["scores"]["bytes_per_score_measured"] - 6.25) < 0.01
    off = st["offload"]
    assert off["bitwise"] and off["score_buffer_before"] > 0 and off["score_buffer_after"] == 0
    assert st["ipc"]["receiver_device"] == ["cpu"] and st["ipc"]["buckets"] >= 1
    assert st["tests"]["tests"] > 0 and not st["tests"]["failed"]
    # no Ray there: the train step is recorded as not run, with the reason (its run: the test below)
    assert st["train_step"]["ran"] is False and "Ray is not installed" in st["train_step"]["skipped"]
    mu = st["mu_pass"]                               # the CPU rehearsal's smaller shard, reported as such
    assert mu["shape"] == [256, 151936] and mu["top_k"] == 20 and mu["top_p"] == 0.95 and mu["targets_kept"] == 1.0
    assert mu["plain_ms"] > 0 and mu["sampled_ms"] > 0 and mu["sampled_peak_gib"] is None   # no device peak on CPU
    assert "(skipped: train_step)" in r.stdout
    out_files = list((tmp_path / "out").iterdir())
    assert {f.name for f in out_files} == {"gpu_check.json", "gpu_check.log", "tests_gpu.log"}
    assert all(f.stat().st_size < 1 << 20 for f in out_files)                       # OUT: small files only
    assert (tmp_path / "work" / "model" / "model.safetensors").is_file()               # big ones in WORK


def _import_patches(tmp: Path, pythonpath: str) -> list[str]:
    code = ("import importlib.util, sys, megatron_rl, megatron_rl.patches as p; "      # no torch: the patches' own
            "print(p.__file__); print(importlib.util.find_spec('megatron_rl.patches.cpu_cuda_rng').origin); "
            "print(any(type(f).__name__ == '_CheckoutPatches' for f in sys.meta_path))")
    env = lent_env(tmp)
    env["PYTHONPATH"] = pythonpath
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, cwd=tmp, check=True)
    return out.stdout.split()


def test_patches_import_from_a_plain_checkout_and_from_an_install(tmp_path):
    lent_env(tmp_path)                                   # writes the sitecustomize
    site = tmp_path / "lent_site"
    got = _import_patches(tmp_path, f"{site}{os.pathsep}{REPO}")
    assert got == [str(REPO / "patches" / "__init__.py"), str(REPO / "patches" / "cpu_cuda_rng.py"), "True"]
    inst = tmp_path / "installed"                        # what setup.py's package_dir makes of it
    shutil.copytree(REPO / "megatron_rl", inst / "megatron_rl")
    shutil.copytree(REPO / "patches", inst / "megatron_rl" / "patches")
    got = _import_patches(tmp_path, f"{site}{os.pathsep}{inst}")
    assert got == [str(inst / "megatron_rl" / "patches" / "__init__.py"),
                   str(inst / "megatron_rl" / "patches" / "cpu_cuda_rng.py"), "False"]


@pytest.mark.parametrize("requested,need,device,expect", [
    ("auto", 90 << 30, 80 << 30, "model.backend=auto found no Transformer Engine (ModuleNotFoundError: x), so"),
    ("local", 90 << 30, 80 << 30, "model.backend=local builds megatron's local attention: 90.0 GiB"),
    ("auto", 10 << 30, 80 << 30, None),
    ("auto", 90 << 30, 0, None),
])
def test_local_attention_that_cannot_fit_is_refused(requested, need, device, expect):
    """``model.backend: auto`` without TE on a GPU is loud: refused in one line when the S x S scores exceed the
    device, a warning line otherwise; local asked for explicitly is refused only when it cannot fit; CPU passes."""
    from megatron_rl.models.provider import check_local_attention

    if expect is None:
        line = check_local_attention(requested, "local", need, device, "ModuleNotFoundError: x")
        assert (line is None) == (device == 0) and (line is None or "found no Transformer Engine" in line)
        return
    with pytest.raises(ValueError, match=r"exceed the device's 80\.0 GiB") as e:
        check_local_attention(requested, "local", need, device, "ModuleNotFoundError: x")
    assert expect in str(e.value) and "\n" not in str(e.value)
    assert check_local_attention(requested, "te", need, device, None) is None


def test_local_attention_bytes_follow_plan():
    """The start-up figure is plan's local-attention terms (``planning/memory.py``) for the same micro-batch: the
    scores every layer keeps, one layer's working set and megatron's persistent score buffer."""
    from megatron_rl.planning.arch import PRESETS, ArchSpec
    from megatron_rl.planning.memory import PlanInputs, attention_bytes, buffer_bytes
    from megatron_rl.models.provider import ArchInfo, local_attention_bytes

    q = PRESETS["qwen3-8b"]
    arch = ArchInfo("Qwen3ForCausalLM", q["num_hidden_layers"], q["hidden_size"], q["num_attention_heads"],
                    q["num_key_value_heads"], q["head_dim"], q["intermediate_size"], q["vocab_size"], False, False,
                    True, 1e-6, 1e6, None, 40960)
    need = local_attention_bytes(arch, tp=4, pp=1, tokens=40960, row_len=40960, bf16=True)
    spec = ArchSpec.from_hf(PRESETS["qwen3-8b"], "qwen3-8b")
    inp = PlanInputs(tp=4, max_tokens_per_micro_batch=40960, max_model_len=40960, seq_len=40960, attention="local")
    keep, working = attention_bytes(inp)
    elements = 40960 * 40960 * 32 // 4                                   # one layer's scores on this GPU
    assert buffer_bytes(spec, inp, True) == 2 * elements                # the persistent buffer, bf16
    assert need == elements * (keep * 36 + working) + buffer_bytes(spec, inp, True)
    assert need > 80 << 30                                              # the 8B packed rows: certain OOM, now refused


def test_the_wheel_the_gpu_page_fetches_is_the_one_the_lent_machine_needs():
    """``docs/gpu-status.md``'s ``make gpu-wheels`` (a dry run: the download itself needs PyPI) fetches
    megatron-core 0.16.1 — the version ``requirements/gpu.txt`` pins — for CPython 3.12 only, into ``.whl/``."""
    page = (REPO / "docs" / "gpu-status.md").read_text()
    assert "make gpu-wheels" in page
    r = subprocess.run(["make", "-n", "gpu-wheels"], cwd=REPO, capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    dl = r.stdout.replace("\\\n", " ")   # the recipe's continued lines as one command
    dl = next(ln for ln in dl.splitlines() if "pip download" in ln)
    pinned = next(ln.strip() for ln in (REPO / "requirements" / "gpu.txt").read_text().splitlines()
                  if ln.startswith("megatron-core"))
    assert pinned in dl and "--python-version 3.12" in dl and "--only-binary=:all:" in dl and "-d .whl" in dl, dl


def _runner(tmp: Path, env: dict, *args: str, timeout: float = 300) -> tuple[subprocess.CompletedProcess, dict]:
    r = subprocess.run([sys.executable, str(RUNNER), "--out", str(tmp / "out"), "--work", str(tmp / "work"), *args],
                       env=env, capture_output=True, text=True, timeout=timeout, cwd=tmp)
    rec = json.loads((tmp / "out" / "gpu_check.json").read_text())
    return r, {s["stage"]: s for s in rec["stages"]}


def test_train_step_stage_runs_one_megatron_rl_train_step(tmp_path):
    """``train_step`` (review row B1's smoke) where Ray is installed (this environment, not the lent machine's):
    the real ``megatron-rl train`` in its own process, world 1, the HF engine, top-k / top-p on, one step in
    ``metrics.jsonl``, exit status 0; the engine-trainer readings the first GPU run should report come with it."""
    r, st = _runner(tmp_path, repo_env(), "--only", "train_step", timeout=420)
    ts = st["train_step"]
    assert list(st) == ["train_step"] and r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert ts["ok"] and ts["ran"] and ts["exit_status"] == 0 and ts["steps"] == 1, ts
    assert ts["trainer_device"] == "cpu" and {"rollout/logprob_gap", "rollout/outside_support_frac"} <= set(ts["metrics"])


def test_env_stage_fails_without_the_c_compiler_triton_needs(tmp_path):
    """The env stage fails in one line naming what Triton's launcher build lacks and the package: here a
    ``CC`` that does not exist (Triton takes ``$CC`` first, as the stage does)."""
    r, st = _runner(tmp_path, lent_env(tmp_path, {"CC": str(tmp_path / "no-such-cc")}), "--only", "env")
    env = st["env"]
    assert r.returncode == 1 and env["ok"] is False and env["c_compiler"] is None, env
    assert "no C compiler" in env["error"] and "apt-get install gcc" in env["error"] and "\n" not in env["error"]
    assert "[gpu-check] env: FAILED {\"error\": \"no C compiler" in r.stdout      # the why first on the console


def test_toolchain_lines_name_what_is_missing_and_the_package(tmp_path):
    """``toolchain_missing``: one line per missing piece (a C compiler; ``Python.h`` in the include dir Triton
    uses), each naming the apt package; nothing when both are there."""
    stages = load_tool("gpu_check_stages")
    v = f"{sys.version_info.major}.{sys.version_info.minor}"
    lines = stages.toolchain_missing(None, str(tmp_path), "no gcc or clang on PATH and CC unset")
    assert len(lines) == 2 and all("\n" not in ln for ln in lines)
    assert "no C compiler (no gcc or clang on PATH" in lines[0] and "apt-get install gcc" in lines[0]
    assert f"no Python.h in {tmp_path}" in lines[1] and f"apt-get install python{v}-dev" in lines[1]
    (tmp_path / "Python.h").write_text("")
    assert stages.toolchain_missing("/usr/bin/gcc", str(tmp_path)) == []
    cc, line = stages.c_compiler()                  # this host's: the rehearsal above passed with it
    assert cc and line and stages.toolchain_missing(cc, stages.python_include_dir()) == []
