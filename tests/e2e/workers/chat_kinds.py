"""Every ``algo.kind`` for a few RL steps on the chat-template fixture, in ONE process with ONE vLLM
engine pool (Ray actor) reused across kinds — the engine start dominates a short run.

    python tests/e2e/workers/chat_kinds.py FIXTURE_DIR OUT_DIR GRADER_URL KIND [KIND ...]

Every kind trains with PPO mini-batches (``trainer.mini_batch_prompts``): 4 per RL step (1 prompt x
``rollout.n`` = 4 rows each), or 2 for the kinds of :data:`TWO_MINI_BATCHES`, and packed token-budget
micro-batches (``trainer.max_tokens_per_micro_batch`` = :data:`BUDGET`). A KIND may carry
variants, ``<kind>@<variant>[@<variant>…]``:

    @async    one-step-off (``rollout.max_staleness=1``) for STEPS + 1 steps
    @mb2      2 / 4 mini-batches (``@mb4``) at ``optim.lr`` = :data:`LR_MOVE` (the policy moves
    @mb4      between them: clip fractions act from the second one on), padded micro-batches of 4 rows;
              every rollout is dumped;
              dapo: up to 4 generation rounds, so that every group is informative (non-zero advantages)
    @mbsM     ``trainer.micro_batch_size=M`` (micro-batch invariance against the same kind without it)
    @guard    ``rollout.mismatch_limit`` = 1.0000001 with ``mismatch_policy=stop`` (below the healthy fp32
              value): the run stops after step 1; results hold its exit status and printed stop line
    @warn     the same limit with ``mismatch_policy=warn``: one warning line per step, the run completes
    @bypass   ``algo.off_policy=bypass`` and no KL term (no reference model): no log-prob pass at all
    @mu       top-p 0.7, top-k 20, min-p 0.02 with ``algo.ratio_space=sampling``: the trainer's log-probs under
              the engines' sampling distribution μ (``algorithms/sampling.py``) in the comparisons and the ratio
    @seq_mis  ``algo.off_policy=seq_mis`` with the band [1, 1.001]: sequences with ρ < 1 are rejected
    @kk       one step on Logic-RL Knights & Knaves rows (:func:`write_logic_rl`; the ``kk`` reward), evaluated
              on two named benchmarks (``trainer.eval_benchmarks``, :func:`write_benchmarks`)
    @probe    (a teacher kind: opsd, sdpo) ONE RL step of 4 mini-batches at LR_MOVE through a subclass
              of its data path that records the policy and teacher weights after every optimizer
              step and the rows / teacher sequences of every support pass; the teacher-minus-student
              mean of each mini-batch is then recomputed under the recorded weights (:func:`probe_teacher`)

Teacher kinds with shadow weights checkpoint every step (``trainer.ckpt_every=1``: the teacher counters
of ``extra_state.pt`` after each step); bicc_rcc takes its old log-probs in the conditioned context it
trains on (bicc keeps the paper's plain one). Writes ``OUT_DIR/results.json`` {kind: {ok, secs, error?,
mini_batch_prompts, micro_batch_size, hparams, probe?}}; each kind's run dir ``OUT_DIR/<kind>`` holds
``metrics.jsonl``, ``optimizer_steps.jsonl`` and ``samples.jsonl`` (``logging.dump_samples``).
"""
from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import os
import sys
import time
import traceback
from pathlib import Path

STEPS = int(os.environ.get("CHAT_KINDS_STEPS", "2"))   # RL steps per kind
PROMPTS, N = 4, 4                                      # data.prompts_per_step, rollout.n
TWO_MINI_BATCHES = ("bicc_rcc", "drgrpo", "opsd_ectr", "rlsd_ectr", "srpo")   # the others: 4
LR_MOVE = "1e-3"             # @mbK / @probe: a learning rate that moves the tiny policy within one step
SHADOW_TEACHERS = ("rlcsd", "rlsd", "rlsd_ectr", "sdpo", "srpo")   # snapshot / ema teacher: ckpt every step
BUDGET = 320                 # token-budget micro-batches (packed) for every kind; the @mbK variants run padded


def overrides(kind: str, fx: dict, out: Path, grader_url: str) -> list[str]:
    from tests.helpers.chat_fixture import SCORE_INSTRUCTION

    base, *variants = kind.split("@")
    mini_batches = 2 if base in TWO_MINI_BATCHES else 4
    ov = [f"model.hf_path={fx['hf_path']}", f"data.train={fx['train']}", "data.val=",
          f"data.prompts_per_step={PROMPTS}", "data.max_prompt_len=64", f"rollout.n={N}", "rollout.max_tokens=24",
          "rollout.max_model_len=320", "rollout.temperature=1.0", "rollout.kv_cache_gib=0.25", "optim.lr=1e-4",
          f"trainer.steps={STEPS}", f"trainer.mini_batch_prompts={PROMPTS // mini_batches}", f"trainer.max_tokens_per_micro_batch={BUDGET}",
          f"trainer.run_dir={out / kind}", "trainer.ckpt_every=0", "trainer.export_hf=false", "trainer.seed=7",
          "logging.wandb_mode=disabled", "logging.progress=false", "logging.dump_samples=2", f"algo.kind={base}"]
    if base in ("opsd", "sdpo", "srpo", "opsd_ectr"):
        ov.append(f"algo.{base}.top_k=8")
    if base in SHADOW_TEACHERS:
        ov += ["trainer.ckpt_every=1", "trainer.keep_last=0"]
    if base == "rlcsd":      # a snapshot sync inside an RL step (every 3rd optimizer step; rlsd keeps 10)
        ov.append("algo.rlcsd.teacher_sync_interval=3")
    if base == "bicc_rcc":   # old log-probs of the conditioned sequences it trains on (bicc: the paper's plain)
        ov.append("algo.bicc_rcc.old_logprob_context=conditioned")
    if base == "score":
        ov += [f"algo.score.instruction={SCORE_INSTRUCTION}", "algo.score.stage1_steps=1"]
    if base == "papo":
        ov += [f"reward.grader_url={grader_url}", "reward.grader_timeout=10", "reward.grader_retries=0"]
    if base == "dapo":
        ov += ["algo.dapo.overlong_buffer_len=8", "algo.dapo.max_num_gen_batches=2", "algo.dapo.at_cap=fill"]
    for v in variants:
        if v == "async":
            ov += [f"trainer.steps={STEPS + 1}", "rollout.max_staleness=1"]
        elif v in ("mb2", "mb4"):     # padded micro-batches of 4 rows (the packed path is every plain kind's)
            ov += [f"trainer.mini_batch_prompts={PROMPTS // int(v[2:])}", f"optim.lr={LR_MOVE}",
                   "trainer.max_tokens_per_micro_batch=0", "trainer.micro_batch_size=4",
                   f"logging.dump_samples={PROMPTS * N}"]
            if base == "dapo":   # dynamic sampling: informative groups, so every mini-batch has advantages
                ov.append("algo.dapo.max_num_gen_batches=4")
        elif v.startswith("mbs"):
            ov.append(f"trainer.micro_batch_size={int(v[3:])}")
        elif v == "guard":     # a mismatch limit below the healthy fp32 value: stops after step 1
            ov += ["rollout.mismatch_limit=1.0000001", "rollout.mismatch_policy=stop", "trainer.steps=3"]
        elif v == "warn":      # the same limit with mismatch_policy=warn: one warning line per step, no stop
            ov += ["rollout.mismatch_limit=1.0000001", "rollout.mismatch_policy=warn"]
        elif v == "bypass":    # π_old := π_rollout; no reference model either, so no log-prob pass runs
            ov += ["algo.off_policy=bypass", f"algo.{base}.kl_loss_coef=0.0"]
        elif v == "mu":        # a truncating sampler and the PPO ratio under it (algo.ratio_space=sampling)
            ov += ["rollout.top_p=0.7", "rollout.top_k=20", "rollout.min_p=0.02", "algo.ratio_space=sampling"]
        elif v == "seq_mis":   # a band [1, 1.001] on the sequence ratio: rows with ρ < 1 leave the loss
            ov += ["algo.off_policy=seq_mis", "algo.correction.lower=1.0", "algo.correction.upper=1.001"]
        elif v == "probe":
            ov += ["trainer.steps=1", "trainer.mini_batch_prompts=1", f"optim.lr={LR_MOVE}"]
        elif v == "kk":          # Logic-RL rows (data_source kk_logic, the {solution_text_format, statements} truth)
            ov += [f"data.train={write_logic_rl(out / 'kk_logic.parquet')}", "data.max_prompt_len=256", "trainer.steps=1",
                   # held-out evaluation = the named benchmarks' table (before and after the step)
                   "trainer.eval_benchmarks=[math, gsm8k]", f"trainer.eval_data_dir={write_benchmarks(fx, out / 'bench')}",
                   "trainer.eval_prompts=3"]
        else:
            raise ValueError(f"unknown variant @{v} of {kind!r}")
    return ov


def write_benchmarks(fx: dict, data_dir: Path) -> Path:
    """Two prepared benchmark dirs (``DIR/math/test.parquet``, ``DIR/gsm8k/test.parquet``: 4 fixture
    validation rows each, ``data_source`` math) for ``trainer.eval_benchmarks``."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = pq.read_table(fx["val"]).to_pylist()
    for i, name in enumerate(("math", "gsm8k")):
        (data_dir / name).mkdir(parents=True, exist_ok=True)
        pq.write_table(pa.Table.from_pylist(rows[4 * i:4 * i + 4]), data_dir / name / "test.parquet")
    return data_dir


def write_logic_rl(path: Path, rows: int = PROMPTS) -> Path:
    """Knights & Knaves rows in Logic-RL's parquet schema (zhiyuanhubj/Logic-RL
    ``examples/data_preprocess/kk.py``): ``data_source`` ``kk_logic``, ``ability`` ``logic``,
    ``reward_model.ground_truth`` = {solution_text_format, statements}, ``extra_info`` {split, index}."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from megatron_rl.rewards.knights_knaves import generate_puzzle

    puzzles = [generate_puzzle(2, seed) for seed in range(rows)]
    path.parent.mkdir(parents=True, exist_ok=True)
    ask = ("\nState each person's identity in <answer> </answer> tags, e.g. "
           "<answer> (1) Zoey is a knight\n(2) Oliver is a knave </answer>.")
    pq.write_table(pa.table({
        "data_source": ["kk_logic"] * rows,
        "prompt": [[{"role": "user", "content": p["question"] + ask}] for p in puzzles],
        "ability": ["logic"] * rows,
        "reward_model": [{"style": "rule", "ground_truth": {
            "solution_text_format": "\n".join(f"({i + 1}) {n} is a {r}" for i, (n, r) in enumerate(p["solution"].items())),
            "statements": str(p["statements"])}} for p in puzzles],
        "extra_info": [{"split": "train", "index": i} for i in range(rows)],
    }), path)
    return path


def probe_teacher(cfg, client) -> dict:
    """One RL step of ``cfg`` (a teacher kind) with its data path replaced by a recording subclass;
    then, for each mini-batch k, the token mean of teacher − student log-probs over its response
    tokens recomputed with plain unpacked forwards (independent of the packed support pass): the
    student under W_k (the policy after k optimizer steps: what the loss saw), the teacher under T_k
    (``fresh``: the teacher weights after k schedule moves — W_k itself for a ``fixed`` teacher, the
    EMA after k moves for ``ema``) and under T_0 (``stale``: a teacher frozen before the update).
    ``seen``: the ``distill/teacher_minus_student`` the loss logged for that mini-batch
    (``optimizer_steps.jsonl``)."""
    import torch

    from megatron_rl.trainer.loop.rl_loop import rl_step
    from megatron_rl.trainer.loop.rollout_source import open_source
    from megatron_rl.trainer.loop.setup import setup_run
    from megatron_rl.trainer.paths import path_class
    from megatron_rl.trainer.contract import PathSetup
    from megatron_rl.trainer.pipeline.batch import make_batch
    from megatron_rl.trainer.pipeline.update import OPTIMIZER_STEPS_FILE
    from megatron_rl.trainer.pipeline.sequences import response_frame

    class Recording(path_class(cfg.algo.kind)):
        """The method's own path; records the policy W and teacher T weights before the update and
        after each optimizer step, and what each support pass was handed (rows, teacher sequences,
        their owners)."""

        def setup(self, ctx):
            super().setup(ctx)
            self.params = [p for m in ctx.actor.bare_models() for p in m.parameters()]
            self.weights, self.teachers, self.passes = [], [], []
            self._record()

        def _record(self):
            self.weights.append([p.detach().clone() for p in self.params])
            shadow = self.teacher.shadow if self.teacher.has_shadow else self.params
            self.teachers.append([t.detach().clone() for t in shadow])

        def teacher_sequences(self, ctx, rows, step):
            seqs, owner = super().teacher_sequences(ctx, rows, step)
            self.passes.append((rows, seqs, owner))
            return seqs, owner

        def after_optimizer_step(self):
            super().after_optimizer_step()
            self._record()

    rn = setup_run(cfg, client=client)
    rn.path.close()
    rec = Recording(cfg, rn.tok)
    rec.setup(PathSetup(rn.actor, rn.info.is_driver))
    rn = dataclasses.replace(rn, path=rec)     # the run is frozen: the same components, this path
    rn.state.source = open_source(rn)
    try:
        rn.logger.log(1, rl_step(rn, 1))
    finally:
        rn.state.source.close()
        rn.close(own_client=False)
    assert len(rec.weights) == len(rec.passes) + 1, (len(rec.weights), len(rec.passes))

    def load(w):
        with torch.no_grad():
            for p, v in zip(rec.params, w):
                p.copy_(v)

    def student(rows):
        return response_frame(rn.actor.forward_logprobs(rows.seqs.batch, 1).logp, rows.seqs)

    def teacher(rows, seqs, owner):
        out = torch.zeros_like(rows.seqs.resp_mask)
        for (prompt, resp), (j, slot) in zip(seqs, owner):
            if slot == 0:
                lp = rn.actor.forward_logprobs(make_batch([prompt], [resp], rn.tok.pad_id), 1).logp[0]
                r = min(len(resp), out.shape[1])
                out[j, :r] = lp[len(prompt) - 1: len(prompt) - 1 + r]
        return out

    seen = [json.loads(x)["distill/teacher_minus_student"]
            for x in (Path(cfg.trainer.run_dir) / OPTIMIZER_STEPS_FILE).read_text().splitlines()]
    fresh, stale = [], []
    for k, (rows, seqs, owner) in enumerate(rec.passes):
        m = rows.seqs.resp_mask
        load(rec.weights[k])
        s = student(rows)
        for weights, out in ((rec.teachers[k], fresh), (rec.teachers[0], stale)):
            load(weights)
            out.append(float(((teacher(rows, seqs, owner) - s) * m).sum() / m.sum()))
    load(rec.weights[-1])

    def moved(ws):
        return [max(float((a - b).abs().max()) for a, b in zip(w, ws[0])) for w in ws]

    # the schedule's arithmetic per optimizer step: T_k = W_k (fixed), d T_{k-1} + (1 - d) W_k (ema)
    d = rec.teacher.ema_decay if rec.teacher.mode == "ema" else 0.0
    residual = max(float((t - (d * t0 + (1 - d) * w)).abs().max()) for k in range(1, len(rec.teachers))
                   for t, t0, w in zip(rec.teachers[k], rec.teachers[k - 1], rec.weights[k]))
    return {"seen": seen, "fresh": fresh, "stale": stale, "policy_moved": moved(rec.weights),
            "teacher_moved": moved(rec.teachers), "teacher_mode": rec.teacher.mode, "schedule_residual": residual}


def main(fixture_dir: str, out_dir: str, grader_url: str, kinds: list[str]) -> int:
    from megatron_rl.runtime.parallel import init_parallel
    from megatron_rl.trainer.loop.preflight import load_checked
    from megatron_rl.trainer.loop.rl_loop import run
    from megatron_rl.trainer.loop.setup import build_client
    from megatron_rl.trainer.loop.stop import Stopped
    from tests.helpers.chat_fixture import build_chat_fixture

    fx = build_chat_fixture(fixture_dir)
    out = Path(out_dir)
    init_parallel(1, 1, seed=0)
    client, results = None, {}
    for kind in kinds:
        t0 = time.time()
        try:
            cfg = load_checked(None, overrides(kind, fx, out, grader_url))
            results[kind] = {"mini_batch_prompts": cfg.trainer.mini_batch_prompts,
                             "micro_batch_size": cfg.trainer.micro_batch_size,
                             "max_tokens_per_micro_batch": cfg.trainer.max_tokens_per_micro_batch,
                             "hparams": dataclasses.asdict(cfg.algo.hparams)}
            if client is None:
                client = build_client(cfg)
            if kind.endswith("@probe"):
                results[kind]["probe"] = probe_teacher(cfg, client)
            elif kind.endswith(("@guard", "@warn")):   # the guard: its exit status and the lines it prints
                buf = io.StringIO()
                try:
                    with contextlib.redirect_stdout(buf):
                        run(cfg, client=client)
                except Stopped as e:
                    results[kind]["exit"] = e.code
                results[kind]["said"] = [x for x in buf.getvalue().splitlines() if "stopped by" in x or "warning: step" in x]
                print(buf.getvalue(), end="", flush=True)
            else:
                run(cfg, client=client)
            results[kind]["ok"] = True
        except BaseException as e:  # noqa: BLE001 - reported per kind, the next kind still runs
            results.setdefault(kind, {}).update(ok=False, error="".join(traceback.format_exception(e))[-4000:])
        results[kind]["secs"] = round(time.time() - t0, 1)
        print(f"[chat_kinds] {kind}: {({k: v for k, v in results[kind].items() if k not in ('hparams', 'probe')})}",
              flush=True)
    if client is not None:
        client.shutdown()
    (out / "results.json").write_text(json.dumps({"fixture": fx, "kinds": results}, indent=1))
    return 0


if __name__ == "__main__":
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    sys.exit(main(sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]))
