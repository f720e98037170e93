"""One step's trajectories as flat tensors (:class:`Rollouts`) and the driver functions that produce them:
generate (engines -> tensors, texts decoded in batch), score, DAPO overlong shaping, select / concat.

Layout (sample-major; group g = one prompt, ``rollout.n`` samples each, ``N`` samples, ``T`` response
tokens in all, ``P`` prompt tokens in all)::

    prompt_ids       int32 [P]     every sample's prompt, back to back
    prompt_offsets   int64 [N+1]   sample i's prompt = prompt_ids[prompt_offsets[i]:prompt_offsets[i+1]]
    response_ids     int32 [T]     every sample's response, back to back
    response_offsets int64 [N+1]   sample i's response (and its per-token fields) = [response_offsets[i]:…[i+1]]
    response_logp    fp32  [T]     the engine's log-prob of each response token (``rollout/engine.py``)
    response_mask    uint8 [T]     multi-turn only (else None): 1 = sampled by the policy, 0 = a tool response or
                                   template token the agent loop appended (log-prob 0; out of the loss, docs/multi-turn.md)
    group_ids        int64 [N]     dense group index of each sample
    rewards, correct, greedy_rewards, process   [N] per-sample tensors (None until filled)
    rows, finish                   per-sample Python metadata (the prompt row, "stop" | "length")
    texts                          the decoded responses: a list on the driver; pickled (broadcast, checkpoint)
                                   as one UTF-8 byte buffer with offsets, :class:`Texts`, decoded when read

Per-token fields are the tensors named in :data:`TOKEN_FIELDS` (aligned with ``response_ids``); an
optional one is None when unset. A new per-token field (e.g. the weight version each token was sampled
under, a behaviour log-prob) is a dataclass field defaulting to None plus its name in
:data:`TOKEN_FIELDS`: :meth:`Rollouts.select`, :func:`concat` and the distribution
(``runtime/broadcast.py``: tensors travel out of the pickle as raw bytes, never pickled per element) carry it.
Per-sample tensors are listed in :data:`SAMPLE_FIELDS` the same way. A field named like a registered
loss / advantage input (``algorithms.register_input``: ``rewards``, ``group_ids``, ``correct`` …) is read by the
advantage estimators under that name (``rows.advantage_inputs``): name a new field after an input only
when it is that input.

The list views ``prompts``, ``responses``, ``rollout_logp`` (lists of Python ints / floats, built on
access) serve the code that builds padded batches from them; nothing stores them.

**A data-parallel rank's share** (:class:`Share`, ``trainer/pipeline/dispatch.py``): with DP > 1 a rank
receives every sample's metadata (the offsets, hence the lengths; groups, rewards, finish reasons) but the
token fields of only the rows its policy passes touch (``Share.held``): the token buffers then hold those
rows back to back, while ``prompt_offsets`` / ``response_offsets`` keep the whole batch's frame (so the
lengths stay right). :meth:`Rollouts.prompt` / :meth:`Rollouts.response` / :meth:`Rollouts.held_logp` read a held row;
the whole-batch list views raise on a share, never answer from the wrong rows.
"""
from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Sequence

import numpy as np
import torch

from ..algorithms import dapo_overlong_penalty
from .engine import SamplingParams

#: per-token tensors, aligned with ``response_ids`` (offsets ``response_offsets``)
TOKEN_FIELDS = ("response_ids", "response_logp", "token_versions", "response_mask")
#: optional per-sample tensors ([N]); ``group_ids`` is renumbered by select / offset by concat
SAMPLE_FIELDS = ("rewards", "correct", "greedy_rewards", "process")


def _offsets(lengths) -> torch.Tensor:
    out = torch.zeros(len(lengths) + 1, dtype=torch.int64)
    if len(lengths):
        torch.cumsum(torch.as_tensor(lengths, dtype=torch.int64), 0, out=out[1:])
    return out


def _ragged(flat: torch.Tensor, off: torch.Tensor) -> list[list]:
    """``flat`` cut at ``off`` as lists of Python numbers (one ``tolist`` call)."""
    vals, o = flat.tolist(), off.tolist()
    return [vals[o[i]:o[i + 1]] for i in range(len(o) - 1)]


def _gather(flat: torch.Tensor, off: torch.Tensor, idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Samples ``idx`` of a flat ragged buffer: (their tokens back to back, their offsets)."""
    lens = (off[1:] - off[:-1])[idx]
    new_off = _offsets(lens)
    if not len(idx) or not int(new_off[-1]):
        return flat[:0].clone(), new_off
    # token j of the result comes from off[idx[k]] + (j - new_off[k]) for the sample k it belongs to
    k = torch.repeat_interleave(torch.arange(len(idx)), lens)
    src = off[idx][k] + torch.arange(int(new_off[-1])) - new_off[:-1][k]
    return flat[src], new_off


@dataclasses.dataclass
class Share:
    """What of a step's batch a data-parallel replica holds (``trainer/pipeline/dispatch.py``).

    ``held``: sorted rows whose token fields are present (None = every row: the driver, which collected
    them); ``owned``: sorted rows this replica contributes to the frames the replicas assemble together
    (its rows of the log-prob passes; every row is owned by exactly one replica)."""

    held: torch.Tensor | None
    owned: torch.Tensor


def _rows_of(flat: torch.Tensor, off: torch.Tensor, rows: list[int]) -> torch.Tensor:
    """Rows ``rows`` (sorted) of a flat ragged buffer back to back: one slice per run of consecutive rows
    (a share's rows lie in runs; one copy of their bytes, no index tensor the size of the batch)."""
    o = off.tolist()
    runs, start = [], None
    for k, i in enumerate(rows):
        if start is None:
            start = i
        if k + 1 == len(rows) or rows[k + 1] != i + 1:
            runs.append(flat[o[start]:o[i + 1]])
            start = None
    return torch.cat(runs) if runs else flat[:0].clone()


class Texts(Sequence):
    """Texts as one UTF-8 byte buffer with offsets, each decoded when read: how ``Rollouts.texts`` travels
    (a receiving rank that never reads the texts never builds the strings)."""

    def __init__(self, data: torch.Tensor, offsets: torch.Tensor):
        self.data, self.offsets = data, offsets

    @classmethod
    def of(cls, texts: Sequence[str]) -> Texts:
        raw = [t.encode("utf-8", "surrogatepass") for t in texts]
        blob = b"".join(raw)
        data = torch.frombuffer(bytearray(blob), dtype=torch.uint8) if blob else torch.zeros(0, dtype=torch.uint8)
        return cls(data, _offsets([len(r) for r in raw]))

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        if i < 0:
            i += len(self)
        if not 0 <= i < len(self):
            raise IndexError(i)
        a, b = int(self.offsets[i]), int(self.offsets[i + 1])
        return self.data[a:b].numpy().tobytes().decode("utf-8", "surrogatepass")

    def __eq__(self, other) -> bool:
        return isinstance(other, Sequence) and list(self) == list(other)

    def __repr__(self) -> str:
        return f"Texts({len(self)} texts, {len(self.data)} bytes)"


@dataclasses.dataclass
class Rollouts:
    """One step's trajectories as flat tensors (layout in the module docstring)."""

    rows: list                      # the PromptRow of each sample
    prompt_ids: torch.Tensor        # int32 [P]
    prompt_offsets: torch.Tensor    # int64 [N+1]
    response_ids: torch.Tensor      # int32 [T]
    response_offsets: torch.Tensor  # int64 [N+1]
    response_logp: torch.Tensor     # fp32 [T] engine log-prob per response token
    finish: list[str]               # "stop" | "length" per sample
    group_ids: torch.Tensor         # int64 [N]
    texts: Sequence[str] = dataclasses.field(default_factory=list)   # a list, or Texts once received
    rewards: torch.Tensor | None = None          # [N]
    correct: torch.Tensor | None = None          # [N] bool
    greedy_rewards: torch.Tensor | None = None   # [N] (ReMax)
    stats: dict = dataclasses.field(default_factory=dict)
    process: torch.Tensor | None = None          # [N] PAPO process scores (0 for incorrect)
    weight_version: int | None = None   # optimizer steps in the weights that sampled it (async); None = current
    token_versions: torch.Tensor | None = None   # int32 [T] the weight version that sampled each response token
    #                                              (engines with in-flight updates: a response may span pushes)
    share: Share | None = None   # a DP replica's share of the batch (module docstring); None = not shared out
    response_mask: torch.Tensor | None = None    # uint8 [T] 1 = policy-sampled token (multi-turn; None = all are)

    @classmethod
    def from_lists(cls, rows: list, prompts, responses, logps, finish: list[str], group_ids, texts=(),
                   **fields) -> Rollouts:
        """From ragged Python sequences (tests, the two-attempt path's second prompts); ``fields``: the
        optional per-sample tensors, ``stats``, ``weight_version``."""
        def flat(xs, dtype):
            return torch.from_numpy(np.fromiter(itertools.chain.from_iterable(xs), dtype=dtype))

        if sum(map(len, responses)) != sum(map(len, logps)):
            raise ValueError("from_lists: one log-prob per response token is needed")
        return cls(list(rows), flat(prompts, np.int32), _offsets([len(p) for p in prompts]),
                   flat(responses, np.int32), _offsets([len(r) for r in responses]), flat(logps, np.float32),
                   list(finish), torch.as_tensor(group_ids, dtype=torch.long), list(texts), **fields)

    def __len__(self) -> int:
        return len(self.prompt_offsets) - 1

    def __getstate__(self) -> dict:
        """Pickled (broadcast, checkpointed) with the texts as one byte buffer (:class:`Texts`)."""
        state = dict(self.__dict__)
        if not isinstance(self.texts, Texts):
            state["texts"] = Texts.of(self.texts)
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)

    @property
    def prompt_lens(self) -> torch.Tensor:
        return self.prompt_offsets[1:] - self.prompt_offsets[:-1]

    @property
    def response_lens(self) -> torch.Tensor:
        return self.response_offsets[1:] - self.response_offsets[:-1]

    @property
    def is_share(self) -> bool:
        """Does this object hold the token fields of only some rows (a DP replica's share)?"""
        return self.share is not None and self.share.held is not None

    def _whole(self, what: str) -> None:
        if self.is_share:
            raise RuntimeError(f"Rollouts.{what}: this rank holds the tokens of {len(self.share.held)} of the batch's "
                               f"{len(self)} samples (its data-parallel share); read held rows with prompt(i) / response(i)")

    @property
    def prompts(self) -> list[list[int]]:
        self._whole("prompts")
        return _ragged(self.prompt_ids, self.prompt_offsets)

    @property
    def responses(self) -> list[list[int]]:
        self._whole("responses")
        return _ragged(self.response_ids, self.response_offsets)

    @property
    def rollout_logp(self) -> list[list[float]]:
        self._whole("rollout_logp")
        return _ragged(self.response_logp, self.response_offsets)

    def held_rows(self) -> list[int]:
        """The rows whose token fields this object holds (all, unless it is a share)."""
        return self.share.held.tolist() if self.is_share else list(range(len(self)))

    def _span(self, i: int, prompt: bool) -> tuple[int, int]:
        """Where row ``i``'s prompt (or response and its per-token fields) lies in the token buffers."""
        off = self.prompt_offsets if prompt else self.response_offsets
        if not self.is_share:
            return int(off[i]), int(off[i + 1])
        held = self.share.held
        k = int(torch.searchsorted(held, i))
        if k >= len(held) or int(held[k]) != i:
            raise KeyError(f"Rollouts: sample {i} is not held on this rank (its data-parallel share holds "
                           f"{len(held)} of {len(self)} samples)")
        lens = (off[1:] - off[:-1])[held]
        start = int(lens[:k].sum())
        return start, start + int(lens[k])

    def prompt(self, i: int) -> list[int]:
        a, b = self._span(i, True)
        return self.prompt_ids[a:b].tolist()

    def response(self, i: int) -> list[int]:
        a, b = self._span(i, False)
        return self.response_ids[a:b].tolist()

    def token_spans(self) -> tuple[list[int], list[int], list[int]]:
        """(rows held, where each one's prompt starts in ``prompt_ids``, where its response starts in
        ``response_ids``): one pass for code that walks every held row."""
        rows = self.held_rows()
        if not self.is_share:
            return rows, self.prompt_offsets[:-1].tolist(), self.response_offsets[:-1].tolist()
        h = self.share.held
        return rows, _offsets(self.prompt_lens[h])[:-1].tolist(), _offsets(self.response_lens[h])[:-1].tolist()

    def held_tokens(self, i: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Row ``i``'s prompt ids, response ids and engine log-probs as tensor views (KeyError if not held)."""
        a, b = self._span(i, True)
        c, d = self._span(i, False)
        return self.prompt_ids[a:b], self.response_ids[c:d], self.response_logp[c:d]

    def hold(self, held: list[int], owned: list[int]) -> Rollouts:
        """The share of a replica that holds the token fields of rows ``held`` and owns ``owned`` (both
        sorted; ``owned`` within ``held``): every per-sample field, the token fields of ``held`` only,
        no texts (the driver alone reads them), prompt rows of ``held`` only (None elsewhere)."""
        if self.is_share:
            raise RuntimeError("Rollouts.hold: already a share")
        if self.token_versions is not None:
            raise ValueError("Rollouts.hold: per-token weight versions travel whole (partial rollouts are not shared out)")
        h = torch.as_tensor(held, dtype=torch.long)
        prompt_ids = _rows_of(self.prompt_ids, self.prompt_offsets, held)
        response_ids = _rows_of(self.response_ids, self.response_offsets, held)
        response_logp = _rows_of(self.response_logp, self.response_offsets, held)
        response_mask = None if self.response_mask is None else _rows_of(self.response_mask, self.response_offsets, held)
        keep = set(held)
        return dataclasses.replace(self, rows=[r if i in keep else None for i, r in enumerate(self.rows)],
                                   prompt_ids=prompt_ids, response_ids=response_ids, response_logp=response_logp,
                                   response_mask=response_mask,
                                   texts=[], stats=dict(self.stats),
                                   share=Share(h, torch.as_tensor(owned, dtype=torch.long)))

    def select(self, idx: list[int]) -> Rollouts:
        """Samples ``idx`` in that order (group ids renumbered densely in order of appearance). Of a
        share: the selected rows it holds keep their tokens (the result is a share of the selection,
        owning nothing)."""
        t = torch.as_tensor(idx, dtype=torch.long)
        gmap: dict[int, int] = {}
        gids = [gmap.setdefault(g, len(gmap)) for g in self.group_ids[t].tolist()]
        per = {name: None if getattr(self, name) is None else getattr(self, name)[t] for name in SAMPLE_FIELDS}
        pick = lambda xs: [xs[i] for i in idx]
        frame = dict(rows=pick(self.rows), prompt_offsets=_offsets(self.prompt_lens[t]),
                     response_offsets=_offsets(self.response_lens[t]), finish=pick(self.finish),
                     group_ids=torch.tensor(gids, dtype=torch.long), texts=pick(self.texts) if self.texts else [],
                     stats=dict(self.stats), **per)
        if self.is_share:
            rows, p_at, r_at = self.token_spans()
            at = {i: (a, b) for i, a, b in zip(rows, p_at, r_at)}
            keep = [j for j, i in enumerate(idx) if i in at]
            pl, rl = self.prompt_lens.tolist(), self.response_lens.tolist()

            def cat(flat, lens, which):
                parts = [flat[at[idx[j]][which]:at[idx[j]][which] + lens[idx[j]]] for j in keep]
                return torch.cat(parts) if parts else flat[:0].clone()

            return dataclasses.replace(self, **frame, prompt_ids=cat(self.prompt_ids, pl, 0),
                                       response_ids=cat(self.response_ids, rl, 1),
                                       response_logp=cat(self.response_logp, rl, 1),
                                       response_mask=None if self.response_mask is None else cat(self.response_mask, rl, 1),
                                       share=Share(torch.as_tensor(keep, dtype=torch.long), torch.zeros(0, dtype=torch.long)))
        tok = {name: None if getattr(self, name) is None else _gather(getattr(self, name), self.response_offsets, t)[0]
               for name in TOKEN_FIELDS}
        return dataclasses.replace(self, **frame, prompt_ids=_gather(self.prompt_ids, self.prompt_offsets, t)[0],
                                   share=None, **tok)


def from_completions(rows: list, comps: list, tokenizer) -> Rollouts:
    """The engines' completions (ordered by prompt, then sample) as :class:`Rollouts`: token ids and
    log-probs copied once into flat buffers (``np.fromiter`` over the chained id tuples: no list per
    sample; the vLLM engines' float32 log-prob arrays joined by one ``np.concatenate``), texts decoded
    in one batch (``decode_batch`` when the tokenizer has it; no texts when ``tokenizer`` is None)."""
    for i, c in enumerate(comps):
        if not c.response_ids:
            raise RuntimeError(f"engine returned an empty response for sample {i}")
        if len(c.logprobs) != len(c.response_ids):
            raise RuntimeError(f"engine returned {len(c.logprobs)} log-probs for the {len(c.response_ids)} tokens of sample {i}")
    chain = itertools.chain.from_iterable
    n_resp = [len(c.response_ids) for c in comps]
    resp = torch.from_numpy(np.fromiter(chain(c.response_ids for c in comps), np.int32, sum(n_resp)))
    logp = _flat_floats([c.logprobs for c in comps], sum(n_resp))
    n_prompt = [len(c.prompt_ids) for c in comps]
    prompt = torch.from_numpy(np.fromiter(chain(c.prompt_ids for c in comps), np.int32, sum(n_prompt)))
    off = _offsets(n_resp)
    labelled = [bool(c.versions) for c in comps]
    if any(labelled) and not all(labelled):
        raise RuntimeError("some completions carry per-token weight versions and others not (engines of one pool differ)")
    vers = torch.from_numpy(np.fromiter(chain(c.versions for c in comps), np.int32, sum(n_resp))) if all(labelled) and comps else None
    masked = [getattr(c, "response_mask", None) is not None for c in comps]   # agent-loop trajectories (multi-turn)
    mask = torch.from_numpy(np.fromiter(chain(c.response_mask for c in comps), np.uint8, sum(n_resp))) \
        if any(masked) else None
    if mask is not None and not all(len(c.response_mask) == len(c.response_ids) for c in comps):
        raise RuntimeError("agent loop returned a response mask that is not one entry per response token")
    return Rollouts([rows[c.prompt_index] for c in comps], prompt, _offsets(n_prompt), resp, off, logp,
                    [c.finish_reason for c in comps], torch.tensor([c.prompt_index for c in comps], dtype=torch.long),
                    [] if tokenizer is None else decode_batch(tokenizer, resp, off), token_versions=vers,
                    response_mask=mask)


def _flat_floats(parts: list, total: int) -> torch.Tensor:
    """Per-sample float sequences (``total`` values in all) back to back as one fp32 tensor: the vLLM
    engines' float32 arrays joined by one ``np.concatenate``; tuples (other engines) through ``np.fromiter``."""
    if parts and all(isinstance(p, np.ndarray) for p in parts):
        return torch.from_numpy(np.concatenate(parts).astype(np.float32, copy=False))
    return torch.from_numpy(np.fromiter(itertools.chain.from_iterable(parts), np.float32, total))


def decode_batch(tokenizer, ids: torch.Tensor, offsets: torch.Tensor) -> list[str]:
    """Texts of the ragged ``ids`` (``offsets``): the tokenizer's batch decoder when it has one (the
    same text as ``decode`` per sample), else ``decode`` per sample."""
    seqs = _ragged(ids, offsets)
    batch = getattr(tokenizer, "decode_batch", None)
    return batch(seqs) if batch is not None else [tokenizer.decode(s) for s in seqs]


def sampling_seed(trainer_seed: int, step: int, round_: int = 0, stream: int = 0) -> int:
    """THE engines' sampling seed of (trainer seed, step, generation round): a resumed run draws exactly the
    same samples as an uninterrupted one. ``stream`` keeps apart draws that share a step number: 0 = the
    step's rollouts (:func:`sampling_params`), 1 = the partial rollouts' pool, whose "step" is the prompt's
    pool index (``trainer/loop/partial_source.PoolPrompts``)."""
    return (trainer_seed * 1_000_003 + step * 7919 + round_ * 104_729 + stream) % (2 ** 31)


def sampling_params(cfg, step: int, round_: int = 0, greedy: bool = False, n: int | None = None,
                    eos_id: int | None = None) -> SamplingParams:
    """Per-step sampling settings; the seed is :func:`sampling_seed` of (trainer seed, step, round)."""
    seed = sampling_seed(cfg.trainer.seed, step, round_)
    r = cfg.rollout
    return SamplingParams(n=1 if greedy else (n or r.n), temperature=r.temperature, top_p=r.top_p, top_k=r.top_k,
                          min_p=r.min_p, max_tokens=r.max_tokens, seed=seed, greedy=greedy,
                          stop_token_ids=() if eos_id is None else (eos_id,))


def eval_sampling(cfg, step: int, eos_id: int | None = None):
    """The held-out sampling settings (``trainer.eval_*``; temperature 0 = greedy)."""
    t = cfg.trainer
    base = sampling_params(cfg, step, greedy=True, eos_id=eos_id)
    if t.eval_temperature == 0:
        return dataclasses.replace(base, max_tokens=t.eval_max_tokens or base.max_tokens)
    return SamplingParams(n=t.eval_n, temperature=t.eval_temperature, top_p=t.eval_top_p, top_k=t.eval_top_k,
                          min_p=t.eval_min_p, max_tokens=t.eval_max_tokens or base.max_tokens, seed=base.seed,
                          stop_token_ids=base.stop_token_ids)


def generate(client, dataset, indices: list[int], sampling: SamplingParams, tokenizer) -> Rollouts:
    """Driver only: sample ``sampling.n`` responses for each prompt row in ``indices``."""
    rows = [dataset[i] for i in indices]
    return from_completions(rows, client.generate([list(r.prompt_ids) for r in rows], sampling), tokenizer)


def score(rollouts: Rollouts, reward_manager) -> Rollouts:
    """Fill ``rewards`` / ``correct``; a non-finite reward stops the run naming the sample."""
    return apply_scores(rollouts, reward_manager.score(rollouts.rows, rollouts.texts))


def apply_scores(rollouts: Rollouts, rb) -> Rollouts:
    """:func:`score` with the reward manager's batch ``rb`` already in hand (``pending_rewards.py``)."""
    bad = [i for i, v in enumerate(rb.reward.tolist()) if not math.isfinite(v)]
    if bad:
        raise FloatingPointError(f"non-finite reward for sample(s) {bad[:5]}")
    rollouts.rewards, rollouts.correct = rb.reward, rb.correct
    rollouts.stats = {**rollouts.stats, **rb.stats}
    return rollouts


def overlong_shaping(rollouts: Rollouts, hp, max_tokens: int) -> Rollouts:
    """DAPO soft overlong punishment added to the reward (``correct`` stays the binary outcome)."""
    pen = dapo_overlong_penalty(rollouts.response_lens, max_tokens, hp.overlong_buffer_len,
                                hp.overlong_penalty_factor).float()
    rollouts.rewards = rollouts.rewards + pen
    rollouts.stats = {**rollouts.stats, "reward/overlong_penalty": float(pen.mean())}
    return rollouts


def _cat_opt(parts: list[Rollouts], name: str) -> torch.Tensor | None:
    """Concatenate an optional field; present in some parts only is a bug, not a silent drop."""
    vals = [getattr(p, name) for p in parts]
    if all(v is None for v in vals):
        return None
    if any(v is None for v in vals):
        raise ValueError(f"concat: {name} is set in some generation rounds but not others")
    return torch.cat(vals)


def concat(parts: list[Rollouts]) -> Rollouts:
    """Join rollouts of several generation rounds (group ids offset to stay distinct; ``stats`` and
    ``weight_version`` of the first part)."""
    if any(p.share is not None for p in parts):
        raise ValueError("concat: joins whole batches on the driver, not data-parallel shares")
    gids, off = [], 0
    for p in parts:
        gids.append(p.group_ids + off)
        off = int(gids[-1].max()) + 1 if len(p) else off
    cat_off = lambda name, lens: _offsets(torch.cat([getattr(p, lens) for p in parts]))
    first = parts[0]
    return dataclasses.replace(
        first, rows=[r for p in parts for r in p.rows], prompt_ids=torch.cat([p.prompt_ids for p in parts]),
        prompt_offsets=cat_off("prompt_offsets", "prompt_lens"), response_offsets=cat_off("response_offsets", "response_lens"),
        finish=[f for p in parts for f in p.finish], group_ids=torch.cat(gids),
        texts=[t for p in parts for t in p.texts], stats=first.stats,
        **{name: _cat_opt(parts, name) for name in TOKEN_FIELDS + SAMPLE_FIELDS})
