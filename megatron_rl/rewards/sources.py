"""Which reward scores a row: the ``data_source`` table and the start-up check of a prompt file.

A row's reward is, in order (:func:`resolve`):

1. ``reward.by_source[data_source]`` — the user's explicit choice;
2. the reward the row names (``reward_model.reward``): rows that ``megatron-rl data prepare`` writes name their
   seed reference's reward (:data:`PREPARED`), so a prepared RLCSD AIME row (box-based ``math``) and a verl
   ``aime24`` row (verl's ``math_dapo``) each get their own reference's verdict without a config line;
3. the built-in table: verl's ``default_compute_score`` names with verl's rules (:data:`VERL_SOURCES`,
   ``rewards/verl_rules.py``), then this project's own names (:data:`OWN_SOURCES`), then prefixes;
4. ``reward.default`` — a fallback only when the user wrote one (logged once per source with its row count);
5. none: the file is refused before anything starts (:func:`check_rows`), one line listing each unmapped
   source with its row count and the fix. Multimodal files (an ``images`` / ``videos`` column) are refused too.

A file written by an older ``megatron-rl data prepare`` (a ``manifest.json`` of that tool beside it, rows
naming no reward) is refused with the command that remakes it: its ``aime24`` / ``math_dapo`` rows would
otherwise be read as verl's.
"""
from __future__ import annotations

import collections
import json
import logging
from pathlib import Path

log = logging.getLogger("megatron_rl.rewards")

#: verl's ``default_compute_score`` table (verl-project/verl ``verl/utils/reward_score/__init__.py``, 0.9.1)
VERL_SOURCES = {"openai/gsm8k": "gsm8k_strict",
                "lighteval/MATH": "hendrycks_math", "DigitalLearningGmbH/MATH-lighteval": "hendrycks_math",
                "HuggingFaceH4/MATH-500": "hendrycks_math",
                "math_dapo": "math_dapo", "math": "math_dapo", "math_dapo_reasoning": "math_dapo",
                **{f"numina_{s}": "prime_math" for s in ("aops_forum", "synthetic_math", "amc_aime", "synthetic_amc",
                                                          "cn_k12", "olympiads")}}
#: verl's prefix rule: every name starting with ``aime`` gets its ``math_dapo``
VERL_PREFIXES = (("aime", "math_dapo"),)
#: names verl scores that this project does not, and why (refused like any unmapped source)
VERL_UNSCORED = {**{s: "code: verl runs it in a sandbox" for s in ("codecontests", "apps", "codeforces", "taco")},
                 "hiyouga/geometry3k": "multimodal (images)",
                 **{f"searchR1_{s}": "search-agent QA" for s in ("nq", "triviaqa", "popqa", "hotpotqa", "2wikimultihopqa",
                                                                  "musique", "bamboogle")}}
#: this project's own names: the synthetic tasks, ``data generate kk`` and other K&K files, RLCSD's ``gsm8k``
OWN_SOURCES = {"reverse": "exact", "addition": "exact", "knights_knaves": "kk", "kk": "kk", "kk_logic": "kk",
               "logic_kk": "kk", "gsm8k": "math", "amc": "math", "math500": "math", "deepmath": "math", "amc23": "math",
               "numina_math_process": "papo_math", "olympiadbench": "papo_math", "gpqa_diamond": "gpqa",
               "score_gsm8k": "score_exact_match", "score_math": "score_exact_match_math"}
#: prefixes of this project's names (RLCSD's ``kk_4to8``, ``kk_4to8_test``, ``kk_9`` ...)
OWN_PREFIXES = (("kk_", "kk"),)
#: the reward each ``megatron-rl data prepare`` data_source is written with (``reward_model.reward``): its seed
#: reference's (RLCSD's box-based ``math``, BiCC's / DAPO's ``dapo``, PAPO's ``papo_math`` ...)
PREPARED = {"deepmath": "math", "math500": "math", "aime24": "math", "aime25": "math", "amc23": "math",
            "numina_math_process": "papo_math", "olympiadbench": "papo_math", "gpqa_diamond": "gpqa",
            "score_gsm8k": "score_exact_match", "score_math": "score_exact_match_math", "math_dapo": "dapo"}
MULTIMODAL_COLUMNS = ("images", "videos")
_PREPARE_TOOL, _MANIFEST = "megatron-rl data prepare", "manifest.json"
_logged: set = set()


def table_reward(data_source: str) -> str | None:
    """The built-in table's reward of ``data_source`` (step 3 of the module docstring), or None."""
    ds = str(data_source)
    name = VERL_SOURCES.get(ds) or OWN_SOURCES.get(ds)
    if name is None:
        name = next((r for p, r in (*VERL_PREFIXES, *OWN_PREFIXES) if ds.startswith(p)), None)
    return name


def resolve(data_source: str, named: str = "", by_source: dict | None = None, default: str | None = None
            ) -> tuple[str | None, str]:
    """``(reward name or None, how)``; how: ``config`` / ``row`` / ``table`` / ``default`` / ``unmapped``."""
    if by_source and data_source in by_source:
        return by_source[data_source], "config"
    if named:
        return named, "row"
    name = table_reward(data_source)
    if name is not None:
        return name, "table"
    if default:
        return default, "default"
    return None, "unmapped"


def row_reward(row: dict) -> str:
    """The reward a verl-column row (a dict) names in ``reward_model.reward`` ("" for none)."""
    rm = row.get("reward_model")
    return str(rm.get("reward") or "") if isinstance(rm, dict) else ""


def unmapped_line(where: str, unmapped: dict[str, int], flag: str = "reward.by_source") -> str:
    """The one line naming each unmapped source with its row count, and the fix."""
    parts = []
    for src, n in sorted(unmapped.items(), key=lambda kv: -kv[1]):
        why = f", {VERL_UNSCORED[src]}: not scored here" if src in VERL_UNSCORED else ", verl has no scorer for it either"
        parts.append(f"{src!r} ({n} rows{why})")
    first = next(iter(sorted(unmapped, key=lambda s: -unmapped[s])))
    fallback = "reward.default=NAME" if flag == "reward.by_source" else "--reward NAME"
    pair = f"{flag}={{{first}: NAME}}" if flag == "reward.by_source" else f"{flag} {first}=NAME"
    return (f"{where}: no reward for data_source {', '.join(parts)}; choose one: {pair}, or a fallback for every "
            f"unmapped source: {fallback} (rewards: see docs/reference/coming-from-verl.md)")


def _scan(path: str) -> tuple[collections.Counter, list[str], bool]:
    """``(Counter of (data_source, named reward), multimodal columns present, any row names a reward)``."""
    import pyarrow.parquet as pq  # lazy: defers pyarrow to the call

    f = pq.ParquetFile(path)
    names = f.schema_arrow.names
    cols = [c for c in ("data_source", "reward_model") if c in names]
    counts: collections.Counter = collections.Counter()
    for batch in f.iter_batches(batch_size=4096, columns=cols):
        d = batch.to_pydict()
        rms = d.get("reward_model") or [None] * batch.num_rows
        for ds, rm in zip(d.get("data_source") or [None] * batch.num_rows, rms):
            named = rm.get("reward") if isinstance(rm, dict) else None
            counts[(str(ds), str(named or ""))] += 1
    return counts, [c for c in MULTIMODAL_COLUMNS if c in names], any(n for _, n in counts)


def _legacy_prepared(path: str) -> str | None:
    """The remake command of a file an older ``data prepare`` wrote (manifest beside it), else None."""
    try:
        meta = json.loads((Path(path).parent / _MANIFEST).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(meta, dict) or meta.get("tool") != _PREPARE_TOOL:
        return None
    return str(meta.get("command") or f"megatron-rl data prepare {meta.get('source', '<source>')} ...")


def check_counts(where: str, counts: dict, by_source: dict | None, default: str | None, flag: str = "reward.by_source"
                 ) -> dict[str, str]:
    """Every (data_source, named reward) of ``counts`` resolves to a registered reward, else one-line
    ``ValueError``; a ``reward.default`` fallback is logged once per source with its count. Returns
    ``{data_source: reward}``."""
    from megatron_rl.rewards.registry import get_reward  # lazy: the registry imports the verifiers

    unmapped: dict[str, int] = collections.Counter()
    fallback: dict[str, int] = collections.Counter()
    out = {}
    for (ds, named), n in counts.items():
        name, how = resolve(ds, named, by_source, default)
        if name is None:
            unmapped[ds] += n
            continue
        try:
            get_reward(name)
        except KeyError as e:
            src = "reward_model.reward of its rows" if how == "row" else how
            raise ValueError(f"{where}: data_source {ds!r} ({n} rows): {e.args[0]} (from {src})") from None
        out[ds] = name
        if how == "default":
            fallback[ds] += n
    if unmapped:
        raise ValueError(unmapped_line(where, unmapped, flag))
    for ds, n in fallback.items():
        if (where, ds) not in _logged:
            _logged.add((where, ds))
            log.warning("%s: data_source %r (%d rows) has no reward of its own; scored by your fallback %s=%s",
                        where, ds, n, "reward.default" if flag == "reward.by_source" else "--reward", default)
    return out


def warn_unmatched(flag: str, by_source: dict | None, seen, where: str) -> list[str]:
    """The entries of ``by_source`` whose data source no row of ``where`` has (``seen``: the sources of every
    file the choice applies to): each maps nothing, most likely a typo, so each is one warning line naming
    it (with the closest source that is there); returns them."""
    import difflib  # lazy: only when a mapping is given

    seen = sorted(set(seen))
    missing = sorted(set(by_source or {}) - set(seen))
    for ds in missing:
        if (flag, ds, where) in _logged:
            continue
        _logged.add((flag, ds, where))
        close = difflib.get_close_matches(ds, seen, 1)
        entry = f"{flag}.{ds}={by_source[ds]}" if flag == "reward.by_source" else f"{flag} {ds}={by_source[ds]}"
        log.warning("%s maps nothing: no row of %s has data_source %r%s", entry, where, ds,
                    f" (did you mean {close[0]!r}?)" if close else f"; its sources: {seen[:8]}")
    return missing


def check_rows(where: str, path: str, by_source: dict | None, default: str | None, flag: str = "reward.by_source"
               ) -> dict[str, str]:
    """The start-up check of a prompt / eval parquet (module docstring): one-line ``ValueError`` for a
    multimodal file, an older prepared file, or an unmapped source; returns ``{data_source: reward}``."""
    counts, media, named = _scan(path)
    if media:
        raise ValueError(f"{where}: multimodal rows (a {media[0]!r} column): this project trains and scores text-only "
                         "models; use a text dataset")
    remake = None if named else _legacy_prepared(path)
    if remake is not None:
        raise ValueError(f"{where}: written by an older '{_PREPARE_TOOL}' whose rows do not name their reward (its "
                         f"aime24 / math_dapo rows would now read as verl's); remake it: {remake} --force")
    return check_counts(where, counts, by_source, default, flag)
