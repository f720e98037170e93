"""Datasets: synthetic task files, tokenizers, bad input, resumable sampler."""
from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from megatron_rl.data.dataset import DeterministicSampler, PromptDataset
from megatron_rl.data.synthetic import split_items, task_texts, write_task
from megatron_rl.data.tokenizer import SentencePieceTokenizer, load_tokenizer


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    return SentencePieceTokenizer.train(task_texts("reverse"), tmp_path_factory.mktemp("tok"))


def test_splits_are_disjoint_and_tokenizer_round_trips(tmp_path, tok):
    sp = split_items("reverse", 3, {"train": 9000, "val": 200, "test": 500})
    assert not {p for p, _ in sp["train"]} & {p for p, _ in sp["test"]}
    assert all(a == p[2:6][::-1] for p, a in sp["test"])
    assert tok.decode(tok.encode("R 1234=4321")) == "R 1234=4321"
    t2 = load_tokenizer(tok.path.parent)
    assert t2.encode("R 0099=") == tok.encode("R 0099=") and t2.eos_id == 2 and t2.pad_id == 3
    paths = write_task("reverse", tmp_path, seed=1, sizes={"train": 50, "test": 10})
    ds = PromptDataset.from_parquet(paths["train"], tok, 16)
    assert len(ds) == 50 and ds[0].prompt_ids[0] == tok.bos_id and ds[0].data_source == "reverse"


def _write(path, cols):
    pq.write_table(pa.table(cols), path)


def test_bad_rows(tmp_path, tok):
    good = {"prompt": [[{"role": "user", "content": "R 1234="}]], "data_source": ["reverse"],
            "reward_model": [{"ground_truth": "4321", "style": "rule"}]}
    _write(tmp_path / "nocol.parquet", {k: v for k, v in good.items() if k != "prompt"})
    with pytest.raises(ValueError, match=r"missing column\(s\) \['prompt'\]"):
        PromptDataset.from_parquet(tmp_path / "nocol.parquet", tok, 16)
    bad = {"prompt": [[{"role": "user", "content": "R 1234="}], [{"role": "user", "content": ""}],
                      [{"role": "user", "content": "R 1234=" * 10}], [{"role": "user", "content": "R 1="}]],
           "data_source": ["reverse"] * 4,
           "reward_model": [{"ground_truth": "4321", "style": "rule"}] * 3 + [{"ground_truth": None, "style": "rule"}]}
    _write(tmp_path / "bad.parquet", bad)
    with pytest.raises(ValueError, match="row 1: empty prompt"):
        PromptDataset.from_parquet(tmp_path / "bad.parquet", tok, 16)
    ds = PromptDataset.from_parquet(tmp_path / "bad.parquet", tok, 16, on_error="skip")
    assert len(ds) == 1 and ds.skipped == 3
    wrong = {"prompt": ["just a string"], "data_source": ["reverse"], "reward_model": [{"ground_truth": "1", "style": "r"}]}
    _write(tmp_path / "wrong.parquet", wrong)
    with pytest.raises(ValueError, match="row 0: 'prompt' must be a list of chat messages"):
        PromptDataset.from_parquet(tmp_path / "wrong.parquet", tok, 16)


def test_unknown_data_source_reward(tok):
    from megatron_rl.rewards.manager import RewardManager

    with pytest.raises(KeyError, match="unknown reward 'nope'"):
        RewardManager({"x": "nope"})


def test_sampler_resumes_exactly():
    a = DeterministicSampler(10, 3, seed=5)
    seq = [a.next_batch() for _ in range(7)]
    b = DeterministicSampler(10, 3, seed=5)
    for _ in range(4):
        b.next_batch()
    c = DeterministicSampler(10, 3, seed=5)
    c.load_state_dict(b.state_dict())
    assert [c.next_batch() for _ in range(3)] == seq[4:]
    with pytest.raises(ValueError):
        DeterministicSampler(10, 3, seed=6).load_state_dict(b.state_dict())


def test_hf_tokenizer_from_local_files(tmp_path):
    """HF tokenizers path: a WordLevel tokenizer built locally (no download), saved, reloaded, templated."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "<s>": 1, "</s>": 2, "<unk>": 3, **{c: i + 4 for i, c in enumerate("R 0123456789=")}}
    core = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    fast = PreTrainedTokenizerFast(tokenizer_object=core, bos_token="<s>", eos_token="</s>", pad_token="<pad>",
                                   unk_token="<unk>")
    fast.save_pretrained(str(tmp_path))
    tok = load_tokenizer(tmp_path)
    assert type(tok).__name__ == "HFTokenizer" and tok.eos_id == 2 and tok.pad_id == 0
    ids = tok.encode("R 12=")
    assert tok.decode(ids) .replace(" ", "") == "R12="
    assert tok.apply_chat_template([{"role": "user", "content": "R 12="}]) == "R 12="
