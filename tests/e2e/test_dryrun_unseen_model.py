"""The dry run on a model it has never seen (``model.hf_path``: a folder with only an HF ``config.json``) at a
layout of its own: interleaved pipeline (TP 2 x PP 2 x 2 virtual stages) over the Llama DAPO recipe; 2 roles,
about 1.5 minutes on 2 busy cores."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
UNSEEN = {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 4096, "num_hidden_layers": 32,
          "num_attention_heads": 32, "num_key_value_heads": 4, "intermediate_size": 11008, "vocab_size": 64000,
          "tie_word_embeddings": False, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
          "max_position_embeddings": 32768}


@pytest.mark.slow
def test_dry_run_of_an_unseen_model_at_an_interleaved_layout(tmp_path):
    from megatron_rl.trainer.dryrun.oracles import hf_param_count

    (tmp_path / "config.json").write_text(json.dumps(UNSEEN))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("WORLD_SIZE", None)
    r = subprocess.run([sys.executable, "-m", "megatron_rl.cli", "train", "--config",
                        "examples/configs/llama3_1_8b_dapo.yaml", "--dry-run", f"model.hf_path={tmp_path}",
                        "parallel.tp=2", "parallel.pp=2", "parallel.vpp=2"],
                       capture_output=True, text=True, timeout=1500, cwd=ROOT, env=env, check=False)
    assert r.returncode == 0, r.stderr[-3000:]
    out = r.stdout
    assert "layout TP=2 PP=2 (x2 virtual) DP=4 (16 GPUs)" in out
    assert "stage 0/2 (2 chunks) (rank 0)" in out and "stage 1/2 (2 chunks) (rank 8)" in out
    n = hf_param_count(str(tmp_path))
    assert f"vs transformers' model {n:,}: equal" in out
    last = out.strip().splitlines()[-1]
    assert re.fullmatch(rf"dry run: 2 rank roles, peak \d+\.\d\d GiB on rank (0|8) \(plan \d+\.\d\d GiB\), "
                        rf"parameters {n / 1e9:.3f} B over all ranks", last), last
