"""The LLM judge's start-up check (PAPO's rubric grader, ``papo_math``'s outcome verifier), one of
:func:`megatron_rl.trainer.loop.preflight.preflight`'s checks: the judge answers, its served context
fits ``reward.grader_max_tokens``, and one real request of each prompt — built from the first training
row — gets a reply its parser reads (else one line quoting the reply's start)."""
from __future__ import annotations

import socket
from urllib.parse import urlparse

from megatron_rl.rewards.factory import build_grader, build_outcome_verifier
from megatron_rl.rewards.grader import RUBRIC_PROMPT, parse_score
from megatron_rl.rewards.judge_client import first_reply, one_line, probe, served_max_model_len
from megatron_rl.rewards.outcome_judge import OUTCOME_PROMPT, parse_grade


def _probe_row(cfg) -> dict:
    """The start-up probes' texts, from the first ``data.train`` row as the run will send them (its
    problem, its reference solution — also as the student solution, a realistic length — and its
    ground truth), so a judge context too short for the data is found now; a fixed sample when the
    row lacks them."""
    out = {"problem": "What is 1 + 1?", "reference": "Adding 1 and 1 gives \\boxed{2}.", "truth": "2"}
    try:
        import pyarrow.parquet as pq  # lazy: defers pyarrow to the call

        f = pq.ParquetFile(cfg.data.train)
        cols = [c for c in ("prompt", "extra_info", "reward_model") if c in f.schema_arrow.names]
        row = next(f.iter_batches(batch_size=1, columns=cols)).to_pylist()[0]
    except (OSError, ValueError, StopIteration, IndexError):
        return out
    extra = row.get("extra_info") if isinstance(row.get("extra_info"), dict) else {}
    users = [m.get("content") for m in row.get("prompt") or [] if isinstance(m, dict) and m.get("role") == "user"]
    truth = (row.get("reward_model") or {}).get("ground_truth") if isinstance(row.get("reward_model"), dict) else None
    problem = extra.get("problem") or extra.get("question") or (users[-1] if users else None)
    if problem:
        out["problem"] = str(problem)
    if truth is not None and str(truth).strip():
        out["truth"] = out["reference"] = str(truth)
    if extra.get("reference_solution") or extra.get("solution"):
        out["reference"] = str(extra.get("reference_solution") or extra.get("solution"))
    return out


def check_grader(cfg, timeout: float = 3.0) -> None:
    """The LLM judge at ``reward.grader_url`` (PAPO's rubric grader, ``papo_math``'s outcome verifier) is
    usable: it accepts a TCP connection (unless ``reward.grader_required=false``: then a closed port
    starts the run on the fallback score); the ``max_model_len`` its ``/v1/models`` lists (vLLM's)
    leaves room for ``reward.grader_max_tokens``; and one real request with the rubric prompt and one
    with the outcome prompt — the run's body on the first training row (:func:`_probe_row`), streamed
    and closed after the first chunk — succeed.
    Otherwise one line with the server's own error text (``judge_client.probe``)."""

    from megatron_rl.trainer.paths import path_class  # lazy: defers torch to the call

    r = cfg.reward
    rubric = bool(r.grader_url) and path_class(cfg.algo.kind).uses_grader
    verifier = build_outcome_verifier(cfg)
    if not rubric and verifier is None:
        return
    u = urlparse(r.grader_url)
    if u.scheme not in ("http", "https") or not u.hostname:
        raise ValueError(f"reward.grader_url={r.grader_url!r} is not an http(s) URL (e.g. http://host:8000/v1)")
    port = u.port or (443 if u.scheme == "https" else 80)
    try:
        socket.create_connection((u.hostname, port), timeout=timeout).close()
    except OSError as e:
        if not getattr(r, "grader_required", True):
            return
        raise ValueError(f"reward.grader_url={r.grader_url}: grader unreachable ({e.strerror or e}); start it, fix "
                         "the URL, or set reward.grader_required=false to train on the fallback score") from None

    ctx = served_max_model_len(r.grader_url, r.grader_model, timeout=min(r.grader_timeout, 10.0))
    if ctx is not None and r.grader_max_tokens >= ctx:
        raise ValueError(f"reward.grader_max_tokens={r.grader_max_tokens} cannot fit the grader's context: "
                         f"{r.grader_model!r} at {r.grader_url} serves max_model_len={ctx}, which must hold the prompt "
                         "too; lower it, or set 0 to leave max_tokens to the server")
    p = _probe_row(cfg)
    probes = []
    if rubric:
        probes.append(("rubric", build_grader(cfg), RUBRIC_PROMPT.format(problem=p["problem"], reference=p["reference"],
                                                                        solution=p["reference"]), parse_score,
                       "a score of 0, 0.5 or 1 in \\boxed{} or 'score: x'"))
    if verifier is not None:
        probes.append(("outcome", verifier, OUTCOME_PROMPT.format(question=p["problem"], answer=p["truth"],
                                                                 reference=p["truth"]), parse_grade,
                       "'Final Grade: CORRECT' or 'INCORRECT'"))
    for what, client, prompt, parse, wanted in probes:
        try:
            probe(client, prompt, r.grader_timeout)
        except ValueError as e:
            raise ValueError(f"reward.grader_url={r.grader_url}: a {what} request to model {r.grader_model!r} failed at "
                             f"start-up: {e}") from None
        _check_readable(r, what, first_reply(client, prompt), parse, wanted)


def _check_readable(r, what: str, reply: str | None, parse, wanted: str) -> None:
    """The judge's whole reply to the start-up request carries a verdict its parser reads (else every score of
    the run would be the 0 of an unparsable reply); one line quoting the reply's start."""
    if reply is not None and parse(reply) is None:
        raise ValueError(f"reward.grader_url={r.grader_url}: the {what} judge {r.grader_model!r} answered the start-up "
                         f"request with no verdict its parser reads (wanted {wanted}); its reply begins "
                         f"{one_line(reply, 120)!r}: use a model that follows the prompt's format")
