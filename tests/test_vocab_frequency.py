"""A frequency-ranked draft vocabulary (drafters/frequency.py): the counts beside a drafter's weights, the trim to
the most frequent ids at inference, and `python -m gumiho.train frequency`, which writes the counts."""

from __future__ import annotations

import json
import logging

import pytest
import torch
from safetensors.torch import load_file

import gumiho.target
from gumiho.drafters import Drafter, new_drafter
from gumiho.drafters.frequency import FILE
from gumiho.engine import Engine, GenerationConfig
from gumiho.train.__main__ import main as train_main
from gumiho.train.data import Conversation, split

from .conftest import tiny_target

VOCAB = [1, 3, 5, 7, 9, 11]
COUNTS = [5, 50, 1, 30, 0, 7]


def _drafter(target, kind: str = "eagle2") -> Drafter:
    drafter = new_drafter(kind, target.model.config, seed=0, draft_vocab_size=len(VOCAB))
    drafter.draft_vocab.copy_(torch.tensor(VOCAB))
    return drafter


def test_keep_frequent_keeps_the_most_frequent_ids_and_the_end_tokens():
    target = tiny_target(vocab=16)
    drafter = _drafter(target)
    drafter.vocab_counts = torch.tensor(COUNTS)
    drafter.keep_frequent(3, always={9})  # 9 was never counted: an end token is kept anyway
    assert drafter.draft_vocab.tolist() == [9, 3, 7] and drafter.vocab_counts.tolist() == [0, 50, 30]
    assert drafter.config.draft_vocab_size == 3
    drafter.attach(target.embed_weight, target.head_weight)
    assert torch.equal(drafter.head_weight, target.head_weight[[9, 3, 7]])
    _, ids = drafter.top_tokens(torch.randn(4, 32), 3)
    assert set(ids.flatten().tolist()) == {9, 3, 7}


def test_keep_frequent_changes_nothing_without_counts_or_below_the_vocabulary_size():
    target = tiny_target(vocab=16)
    uncounted = _drafter(target)
    uncounted.keep_frequent(2)
    counted = _drafter(target)
    counted.vocab_counts = torch.tensor(COUNTS)
    counted.keep_frequent(len(VOCAB))
    for drafter in (uncounted, counted):
        assert drafter.draft_vocab.tolist() == VOCAB and drafter.config.draft_vocab_size == len(VOCAB)


def test_counts_travel_with_the_folder_and_the_engine_trims_exactly(tmp_path, monkeypatch):
    target = tiny_target(vocab=16)
    drafter = _drafter(target, "gumiho")
    drafter.vocab_counts = torch.tensor(COUNTS)
    drafter.save_pretrained(tmp_path)
    assert load_file(str(tmp_path / FILE))["counts"].tolist() == COUNTS
    loaded = Drafter.from_pretrained(tmp_path)
    assert loaded.vocab_counts.tolist() == COUNTS
    monkeypatch.setattr(gumiho.target, "FREQUENT_DRAFT_VOCAB", 2)
    engine = Engine(target)
    engine.add_drafter("gumiho", loaded)
    assert engine.drafters["gumiho"].draft_vocab.tolist() == [3, 7]
    config = GenerationConfig(max_new_tokens=24, trace=False)
    assert engine.generate("w3 w7 w3", "gumiho", config).token_ids == engine.generate("w3 w7 w3", "ar", config).token_ids


@pytest.mark.parametrize("content", [b"not a safetensors file", None])
def test_unreadable_or_misfitting_counts_are_ignored_with_a_warning(tmp_path, caplog, content):
    target = tiny_target(vocab=16)
    _drafter(target).save_pretrained(tmp_path)
    if content is None:  # a readable file with counts for another vocabulary
        drafter = _drafter(target)
        drafter.vocab_counts = torch.tensor(COUNTS[:4])
        from gumiho.drafters.frequency import write_counts

        write_counts(tmp_path, drafter.vocab_counts)
    else:
        (tmp_path / FILE).write_bytes(content)
    with caplog.at_level(logging.WARNING):
        loaded = Drafter.from_pretrained(tmp_path)
    assert loaded.vocab_counts is None and "whole draft vocabulary" in caplog.text


def test_the_frequency_command_counts_the_reply_tokens_of_the_training_side(tmp_path):
    target = tiny_target(vocab=16)
    target.tokenizer.save_pretrained(tmp_path / "tokenizer")
    (tmp_path / "tokenizer" / "config.json").write_text(json.dumps({"model_type": "llama"}))
    _drafter(target).save_pretrained(tmp_path / "drafter")
    records = [{"id": f"c{i}", "messages": [{"role": "user", "content": "w1 w2"},
                                            {"role": "assistant", "content": "w3 w3 w7" if i % 2 else "w9 w3"}]}
               for i in range(40)]
    (tmp_path / "data.jsonl").write_text("\n".join(json.dumps(r) for r in records))
    code = train_main(["frequency", "--drafter-dir", str(tmp_path / "drafter"), "--data", str(tmp_path / "data.jsonl"),
                       "--model", str(tmp_path / "tokenizer")])
    assert code == 0
    conversations = [Conversation(r["id"], r["messages"]) for r in records]
    train, _ = split(conversations)
    odd = sum(int(c.id[1:]) % 2 for c in train)
    expected = {1: 0, 3: 2 * odd + (len(train) - odd), 5: 0, 7: odd, 9: len(train) - odd, 11: 0}
    counts = load_file(str(tmp_path / "drafter" / FILE))["counts"].tolist()
    assert counts == [expected[i] for i in VOCAB] and counts[1] > 0
