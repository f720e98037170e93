"""One prepared row from EVERY ``data prepare`` source (each made from a small file in its upstream
schema), concatenated into one parquet, trains 1 GRPO step through ``megatron-rl train`` on the chat
fixture (vLLM CPU + Ray, one subprocess). Every rollout is dumped (``logging.dump_samples``); the step's
``reward/mean`` must equal the mean of each response scored by the reward its row's ``data_source``
selects — the reference reward of its source (DAPO's -1 for a response without an "Answer:" line, the
letter reward for GPQA, SCoRe's match for GSM8K / MATH, ...)."""
from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from tests.helpers.dist import repo_env
from tests.helpers.prepare import reward_of, run, user_text, write_jsonl

ROOT = Path(__file__).resolve().parents[2]
N = 2   # rollout.n
DAPO_TURN = ("Solve the following math problem step by step. The last line of your response should be of the form "
             "Answer: $Answer (no quotes) where $Answer is the answer to the problem.\n\n{}\n\n"
             "Remember to put your answer on its own line after \"Answer:\".")
#: source -> one upstream-schema record (or, for rlcsd_math_eval, its three named parts)
RECORDS = {
    "deepmath_filtered_level7_10": {"question": "Which is larger, 37 or 52?", "final_answer": "52", "difficulty": 7.5,
                                    "topic": "t", "r1_solution_1": "52 > 37, so \\boxed{52}", "r1_solution_2": None,
                                    "r1_solution_3": None},
    "dapo_math_17k": {"data_source": "math_dapo", "prompt": [{"content": DAPO_TURN.format("Which is larger, 11 or 12?"),
                                                              "role": "user"}],
                      "ability": "MATH", "reward_model": {"ground_truth": "12", "style": "rule-lighteval/MATH_v2"},
                      "extra_info": {"index": "u1"}},
    "numinamath_20k_stratified": {"problem": "Which is larger, 21 or 43?", "solution": "43 > 21, \\boxed{43}",
                                  "answer": "43", "problem_type": "Algebra", "question_type": "math-word-problem",
                                  "source": "cn_k12"},
    "math500": {"problem": "Which is larger, 64 or 46?", "solution": "\\boxed{64}", "answer": "64",
                "subject": "Prealgebra", "level": 1, "unique_id": "test/prealgebra/1.json"},
    "aime24": {"ID": "2024-I-1", "Problem": "Which is larger, 70 or 71?", "Solution": "s", "Answer": 71},
    "aime25": {"id": "0", "problem": "Which is larger, 80 or 18?", "answer": "80"},
    "amc23": {"id": 0, "question": "Which is larger, 33 or 39?", "answer": 39.0, "url": "u"},
    "olympiadbench": {"id": 1, "question": "Which is larger, 90 or 19?", "context": None, "final_answer": ["$90$"],
                      "solution": ["90"], "subject": "Math", "language": "English", "modality": "Text-only"},
    "gsm8k": {"question": "Which is larger, 25 or 52?", "answer": "52 > 25\n#### 52"},
    "gpqa_diamond": {"Record ID": "r1", "Question": "Which is larger?", "Correct Answer": "52",
                     "Incorrect Answer 1": "25", "Incorrect Answer 2": "12", "Incorrect Answer 3": "21"},
    "math": {"problem": "Which is larger, 16 or 61?", "level": "Level 1", "type": "Prealgebra",
             "solution": "$\\boxed{61}$"},
    "rlcsd_math_eval": {"amc23": {"id": 1, "question": "Which is larger, 44 or 45?", "answer": "45"},
                        "aime24": {"id": "x", "problem": "Which is larger, 10 or 99?", "answer": "99"},
                        "aime25": {"id": "y", "problem": "Which is larger, 56 or 65?", "answer": "65"}},
    "verl": {"data_source": "kk_4to8", "prompt": [{"role": "user", "content": "Zoey says Oliver is a knave. Oliver "
                                                                               "says Zoey is a knight. Who is who?"}],
             "ability": "logic", "reward_model": {"style": "rule", "ground_truth": "Zoey is a knave, Oliver is a knight"},
             "extra_info": {"split": "train", "index": 0}},
}


def prepared_rows(tmp: Path) -> list[dict]:
    """The first prepared row of every source (all of RLCSD's evaluation file)."""
    from megatron_rl.data.prepare.registry import source_names

    bands = [n for n in source_names() if n.startswith("deepmath_filtered_")]   # one converter, three bands
    assert sorted(RECORDS) == sorted({*source_names()} - set(bands) | {"deepmath_filtered_level7_10"})
    rows = []
    for name, rec in RECORDS.items():
        if name == "rlcsd_math_eval":
            inputs = [(part, write_jsonl(tmp / name / f"{part}.jsonl", [r])) for part, r in rec.items()]
            _, out = run(name, inputs, tmp / "out" / name)
        else:
            _, out = run(name, write_jsonl(tmp / f"{name}.jsonl", [rec]), tmp / "out" / name)
        (split,) = out.values()
        rows += split
    return rows


#: a response that gives the ground truth GT in the form each reward reads
RIGHT = {"math_dapo": "Thinking.\nAnswer: {}", "gpqa_diamond": "Thinking.\nAnswer: {}", "score_gsm8k": "<answer>{}</answer>",
         "score_math": "<answer>{}</answer>", "kk_4to8": "\\boxed{{{}}}"}


def check_loaded_rows(path: Path, hf_path: str) -> None:
    """The mixed file loads through the trainer's loader with the fixture's tokenizer, and the reward
    manager (``reward.default=math``) scores each row's ground truth right and a wrong answer wrong."""
    from megatron_rl.data.dataset import PromptDataset
    from megatron_rl.data.tokenizer import load_tokenizer
    from megatron_rl.rewards.manager import RewardManager

    ds = PromptDataset.from_parquet(path, load_tokenizer(hf_path), max_prompt_len=496)
    rows = list(ds.rows)
    gts = [str(r.ground_truth) for r in rows]
    right = [RIGHT.get(r.data_source, "\\boxed{{{}}}").format(gt) for r, gt in zip(rows, gts)]
    wrong = [RIGHT.get(r.data_source, "\\boxed{{{}}}").format("Zoey is a knight, Oliver is a knave" if r.data_source
                                                                 == "kk_4to8" else "C" if gt != "C" else "A")
             for r, gt in zip(rows, gts)]
    rm = RewardManager(default="math", workers=1)
    good, bad = rm.score(rows, right), rm.score(rows, wrong)
    assert good.reward.tolist() == [1.0] * len(rows), (list(zip([r.data_source for r in rows], good.reward.tolist())), good.stats)
    expect_bad = [-1.0 if r.data_source == "math_dapo" else 0.0 for r in rows]
    assert bad.reward.tolist() == expect_bad, list(zip([r.data_source for r in rows], bad.reward.tolist()))


def _response(text: str) -> str:
    """The response part of a dumped ``prompt + response`` decoding (special tokens kept)."""
    resp = text.rsplit("<|im_start|>assistant\n", 1)[1]
    return resp.split("<|im_end|>", 1)[0].replace("<|endoftext|>", "")


def test_one_row_of_every_source_trains_with_its_reference_reward(chat_fixture, tmp_path):
    rows = prepared_rows(tmp_path)
    path = tmp_path / "mixed.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    check_loaded_rows(path, chat_fixture["hf_path"])
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text("algo:\n  kind: grpo\n")
    run_dir = tmp_path / "run"
    ov = [f"model.hf_path={chat_fixture['hf_path']}", f"data.train={path}", "data.val=", f"data.prompts_per_step={len(rows)}",
          "data.max_prompt_len=496", f"rollout.n={N}", "rollout.max_tokens=16", "rollout.max_model_len=512",
          "rollout.temperature=1.0", "rollout.kv_cache_gib=0.25", "optim.lr=1e-4", "trainer.steps=1", f"trainer.micro_batch_size={N}",
          f"trainer.run_dir={run_dir}", "trainer.ckpt_every=0", "trainer.export_hf=false", "trainer.seed=7",
          "logging.wandb_mode=disabled", "logging.progress=false", f"logging.dump_samples={len(rows) * N}",
          "reward.default=math", "reward.workers=1", "reward.outcome_verifier=false",
          "algo.off_policy=bypass", "algo.grpo.kl_loss_coef=0.0"]   # no log-prob pass: the rewards are the point
    p = subprocess.run([sys.executable, "-m", "megatron_rl.cli", "train", "--config", str(cfg), *ov], cwd=ROOT,
                       capture_output=True, text=True, timeout=400,
                       env={**repo_env(), "OMP_NUM_THREADS": "2", "RAY_AUTH_MODE": "disabled", "PYTHONUNBUFFERED": "1"})
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    (metrics,) = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    samples = [json.loads(x) for x in (run_dir / "samples.jsonl").read_text().splitlines()]
    policy = [s["text"] for s in samples if s["name"] == "policy"]
    assert len(policy) == len(rows) * N
    scores, seen = [], set()
    for text in policy:
        (row,) = [r for r in rows if user_text(r) in text]
        seen.add(row["data_source"])
        scores.append(float(reward_of(row)(_response(text), row["reward_model"]["ground_truth"])))
    assert seen == {r["data_source"] for r in rows}   # every source's row was rolled out and scored
    assert math.isclose(metrics["reward/mean"], sum(scores) / len(scores), abs_tol=1e-6), (metrics["reward/mean"], scores)
    dapo = [s for t, s in zip(policy, scores) if "Answer: $Answer" in t]
    assert dapo and all(s in (-1.0, 1.0) for s in dapo)   # DAPO's +1 / -1, not a 0 / 1 verifier
