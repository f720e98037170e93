"""Shared pytest setup: hardware markers and environment for real (not mocked) components.

``make test`` runs the suite on two pytest-xdist workers (``-n 2 --dist loadfile
--no-loadscope-reorder``): one test's subprocesses rarely keep both cores busy (measured: ~1.1 of 2
cores during the chat-kinds run), two workers do (a third gave no gain: 28:07 vs 27:50, 2026-11-24; nor did one Ray head per worker
that every training subprocess joined through ``RAY_ADDRESS`` instead of starting its own: 31:12). ``loadfile`` keeps
every module on one worker, so module fixtures (a distill warm start, the invariance launches) run
once; ``--no-loadscope-reorder`` keeps the order set here (longest modules first, but never two modules
waiting for the plain warm start side by side at the start) instead of xdist's (most tests first); the session warm starts are built once per run and shared between the workers
through a file lock (``_shared_dir``).
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

#: seconds per module (setup + calls), measured in a ``make test`` on 2 xdist workers (2026-11-24,
#: 2-core host, the junit report; learning / distill / cli / convert_stream after their runs were
#: merged into one worker process each), used only to order the modules for the xdist workers: the
#: longest first, so that the two workers finish together and the many short unit modules (not
#: listed: 0) fill the gaps at the end. A module missing here still runs.
MODULE_SECONDS = {
    "tests/cluster/test_two_nodes.py": 600, "tests/e2e/test_resume.py": 500, "tests/e2e/test_learning.py": 330,
    "tests/e2e/test_distill.py": 340, "tests/e2e/test_score.py": 200, "tests/cluster/test_slurm.py": 210,
    "tests/e2e/test_quickstart.py": 190, "tests/e2e/test_chat_methods.py": 170, "tests/unit/test_cli.py": 15,
    "tests/distributed/test_weight_transport.py": 95,
    "tests/e2e/test_rollout_vllm.py": 125, "tests/e2e/test_verify_sync.py": 115, "tests/unit/rewards/test_judge_vllm.py": 120, "tests/unit/test_convert_stream.py": 50, "tests/unit/test_plan.py": 45,
    "tests/distributed/test_convert.py": 50, "tests/distributed/test_checkpoint.py": 45,
    "tests/distributed/test_invariance.py": 40, "tests/unit/trainer/test_plugin_inputs.py": 40,
    "tests/distributed/test_teacher_pass.py": 35, "tests/unit/convert/test_convert_units.py": 34,
    "tests/distributed/test_actor.py": 19, "tests/distributed/test_backend_wiring.py": 14,
    "tests/distributed/test_actor_vocab_parallel.py": 8, "tests/unit/rewards/test_math_reward.py": 30,
    "tests/unit/rewards/test_math_corpus.py": 15,
    "tests/distributed/test_driver_wait.py": 25,
    "tests/distributed/test_model_device.py": 20, "tests/distributed/test_recompute.py": 45,
    "tests/distributed/test_vpp.py": 25, "tests/distributed/test_context_parallel.py": 20,
    "tests/unit/trainer/test_stop.py": 40, "tests/unit/rollout/test_engine_plugin.py": 35,
    "tests/e2e/test_prepared_sources.py": 90,
    "tests/unit/eval/test_benchmarks.py": 30, "tests/unit/data/test_kk_logic.py": 15,
    "tests/unit/test_gpu_bringup.py": 114, "tests/e2e/test_partial_train.py": 150,
    "tests/e2e/test_inflight_push.py": 45, "tests/unit/rewards/test_verl_table.py": 15,
    "tests/unit/test_bad_data_inputs.py": 15,
    # added 2026-12-05 (measured on 2 shared cores: the junit report of those modules, and make gpu-sim)
    "tests/e2e/test_simulated_gpu.py": 200, "tests/e2e/test_multi_turn_train.py": 90,
    "tests/unit/test_bad_inputs.py": 95, "tests/e2e/test_streamed_push.py": 90, "tests/unit/trainer/test_dryrun.py": 80,
    "tests/e2e/test_dryrun_unseen_model.py": 55, "tests/unit/test_architecture.py": 50, "tests/distributed/test_lora.py": 45,
    "tests/distributed/test_packing.py": 41, "tests/e2e/test_lora_push.py": 40,
}


def pytest_configure(config):
    config.addinivalue_line("markers", "requires_gpus(n): needs n CUDA devices (skipped otherwise)")
    config.addinivalue_line("markers", "slow: long end-to-end test")


def pytest_collection_modifyitems(config, items):
    import torch

    n = torch.cuda.device_count() if torch.cuda.is_available() else 0
    for item in items:
        m = item.get_closest_marker("requires_gpus")
        if m is not None and n < int(m.args[0] if m.args else 1):
            item.add_marker(pytest.mark.skip(reason=f"needs {m.args[0] if m.args else 1} GPU(s), found {n}"))
    if hasattr(config, "workerinput"):  # an xdist worker: its collection order is the scheduling order
        items.sort(key=lambda it: -MODULE_SECONDS.get(_module(it), 0))  # stable: order within a module kept
        _second_module_builds_its_own(items)


def _module(item) -> str:
    return item.nodeid.split("::")[0]


def _second_module_builds_its_own(items: list) -> None:
    """The two workers start on the first two modules at once; when both wait for ``plain_warm``, one
    builds it while the other idles for the whole warm start. Move the longest module that does not
    use it to second place (its own warm start runs beside the shared one)."""
    order = list(dict.fromkeys(_module(it) for it in items))
    uses = {_module(it) for it in items if "plain_warm" in getattr(it, "fixturenames", ())}
    if len(order) < 3 or order[0] not in uses or order[1] not in uses:
        return
    other = next((m for m in order[2:] if m not in uses), None)
    if other is not None:
        rank = {m: i for i, m in enumerate(order)}
        rank[other] = 0.5
        items.sort(key=lambda it: rank[_module(it)])


def _shared_dir(tmp_path_factory, name: str) -> tuple[Path, object]:
    """``(dir, lock)`` for a session artifact built once per pytest run: under xdist every worker has its
    own basetemp below one shared run dir, so the artifact lives there, built by whichever worker
    asks first while the other waits on the lock."""
    from filelock import FileLock

    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent
    return root / name, FileLock(str(root / f"{name}.lock"))


@pytest.fixture(scope="session")
def plain_warm(tmp_path_factory) -> Path:
    """One plain warm-started tiny policy + task data (a ``megatron-rl demo --algo grpo`` run dir's ``data/``
    and ``sft_hf/``: the demo's own warm start, run alone by ``tests/e2e/workers/demo_runs.py`` without the
    demo's RL, evals and export, which no test reads), shared by the learning, resume, quick-start and
    multi-node tests (each warm start costs about a minute on 2 cores).
    ``MEGATRON_RL_TEST_WARM=DIR`` reuses a finished ``megatron-rl demo --algo grpo`` run dir instead."""
    from tests.helpers.demo import demo_runs

    if os.environ.get("MEGATRON_RL_TEST_WARM"):
        d = Path(os.environ["MEGATRON_RL_TEST_WARM"])
        assert (d / "sft_hf" / "config.json").is_file(), f"MEGATRON_RL_TEST_WARM={d}: no sft_hf/ there"
        return d

    root, lock = _shared_dir(tmp_path_factory, "plain")
    d = root / "warm"
    with lock:
        if not (root / "DONE").is_file():
            demo_runs(root / "worker", [], warm={"algo": "grpo", "run_dir": str(d)}, timeout=900)
            (root / "DONE").touch()
    return d


@pytest.fixture(scope="session")
def chat_tokenizer(tmp_path_factory):
    """The chat fixture's HF tokenizer alone (BPE + Qwen specials + ChatML template; ~2 s), wrapped
    in megatron_rl's tokenizer protocol."""
    from megatron_rl.data.tokenizer import load_tokenizer
    from tests.helpers.chat_fixture import train_tokenizer

    d = tmp_path_factory.mktemp("chat_tok")
    train_tokenizer(d)
    return load_tokenizer(d)


@pytest.fixture(scope="session")
def chat_fixture(tmp_path_factory) -> dict:
    """The warm-started tiny chat model + task (``tests.helpers.chat_fixture``), built once per run
    (``build_chat_fixture`` reuses a complete earlier build in the same dir)."""
    from tests.helpers.chat_fixture import build_chat_fixture

    d, lock = _shared_dir(tmp_path_factory, "chat_fixture")
    with lock:
        return build_chat_fixture(d)
