"""ShareGPT decoding (cut-off file), .jsonl data, assistant loss masks, truncation, the split, feature shards and
self-distillation."""

from __future__ import annotations

import json
import re

import pytest
import torch

from gumiho.prompts import read_prompt_file
from gumiho.train.data import Conversation, is_heldout, iter_json_records, load_conversations, render, split
from gumiho.train.features import load_sequences, target_features, write_shard
from tests.conftest import tiny_target

IM_START, IM_END = 1, 2


class CharChatML:
    """ChatML over characters (ids = code points + 10), enough of a tokenizer for `render`."""

    def _text(self, text: str) -> list[int]:
        return [ord(c) + 10 for c in text]

    def apply_chat_template(self, messages, tokenize=True, add_generation_prompt=False):
        ids = []
        for m in messages:
            ids += [IM_START] + self._text(f"{m['role']}\n{m['content']}") + [IM_END] + self._text("\n")
        if add_generation_prompt:
            ids += [IM_START] + self._text("assistant\n")
        return {"input_ids": ids}


def _record(cid: str, *turns: tuple[str, str]) -> dict:
    return {"id": cid, "conversations": [{"from": f, "value": v} for f, v in turns]}


def test_cut_off_file_decodes_complete_records(tmp_path):
    good = [_record("a_0", ("human", "hi"), ("gpt", "hello")), _record("b_0", ("human", "x"), ("gpt", "y"))]
    text = json.dumps(good + [_record("c_0", ("human", "cut"), ("gpt", "off"))], indent=1)
    path = tmp_path / "sharegpt.json"
    path.write_text(text[: text.rindex("off")])  # the third record is cut in the middle
    assert [r["id"] for r in iter_json_records(path.read_text())] == ["a_0", "b_0"]
    loaded = load_conversations(path)
    assert [c.messages for c in loaded][0] == [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]


def test_unusable_records_are_dropped(tmp_path):
    records = [
        _record("ok_0", ("gpt", "leading reply is dropped"), ("human", "q"), ("gpt", "a")),
        _record("twice_0", ("human", "q"), ("human", "q again"), ("gpt", "a")),
        _record("empty_0", ("human", "q"), ("gpt", "  ")),
        _record("alone_0", ("human", "q")),
    ]
    path = tmp_path / "s.json"
    path.write_text(json.dumps(records))
    loaded = load_conversations(path)
    assert [c.id for c in loaded] == ["ok_0"]
    assert loaded[0].messages[0] == {"role": "user", "content": "q"}


def test_mask_covers_assistant_replies_and_their_end_token():
    tok = CharChatML()
    conv = Conversation("x", [{"role": "user", "content": "ab"}, {"role": "assistant", "content": "CD"},
                              {"role": "user", "content": "e"}, {"role": "assistant", "content": "FG"}])
    r = render(conv, tok, max_len=1000, eos_id=IM_END)
    assert r.input_ids == tok.apply_chat_template(conv.messages)["input_ids"]
    masked = [t for t, m in zip(r.input_ids, r.loss_mask) if m]
    assert masked == tok._text("CD") + [IM_END] + tok._text("FG") + [IM_END]


def test_truncation_keeps_mask_aligned():
    tok = CharChatML()
    conv = Conversation("x", [{"role": "user", "content": "ab"}, {"role": "assistant", "content": "C" * 50}])
    full = render(conv, tok, max_len=1000, eos_id=IM_END)
    short = render(conv, tok, max_len=30, eos_id=IM_END)
    assert len(short.input_ids) == len(short.loss_mask) == 30
    assert short.input_ids == full.input_ids[:30] and short.loss_mask == full.loss_mask[:30]
    assert render(conv, tok, max_len=5, eos_id=IM_END) is None  # no assistant token left


def test_split_is_deterministic_and_keeps_parts_together():
    def conv(cid: str, prompt: str) -> Conversation:
        return Conversation(cid, [{"role": "user", "content": prompt}, {"role": "assistant", "content": "ok"}])

    convs = [conv(f"id{i}_{part}", f"question {i} part {part}") for i in range(2000) for part in range(2)]
    train, heldout = split(convs, heldout_percent=5.0)
    assert 100 < len(heldout) < 300 and len(train) + len(heldout) == len(convs)
    held = {c.id.rsplit("_", 1)[0] for c in heldout}
    assert not held & {c.id.rsplit("_", 1)[0] for c in train}
    assert split(convs, heldout_percent=5.0)[1] == heldout
    assert is_heldout("id7_0", 5.0) == is_heldout("id7_1", 5.0)
    # ShareGPT repeats prompts under other ids: a held-out copy of a training prompt (up to case and spacing), or a
    # second copy of a held-out prompt, is dropped.
    held_ids = (f"new{i}_0" for i in range(100_000) if is_heldout(f"new{i}_0", 5.0))
    copy_of_train = conv(next(held_ids), "  " + train[0].messages[0]["content"].upper().replace(" ", "   "))
    copy_of_heldout = conv(next(held_ids), heldout[0].messages[0]["content"])
    assert split(convs + [copy_of_train, copy_of_heldout], 5.0) == (train, heldout)


def test_a_later_round_skips_the_conversations_earlier_rounds_took():
    from gumiho.train.prepare import PrepareConfig, select

    convs = [Conversation(f"c{i}", [{"role": "user", "content": f"q{i}"}]) for i in range(500)]
    first = select(PrepareConfig(out="-", conversations=100), convs)
    later = select(PrepareConfig(out="-", conversations=50, skip=100), convs)
    assert select(PrepareConfig(out="-", conversations=150), convs) == first + later
    assert len(later) == 50 and not {c.id for c in first} & {c.id for c in later}


def test_feature_shards_round_trip_and_match_unbatched_forward(tmp_path):
    from gumiho.train.data import Rendered

    target = tiny_target(vocab=32)
    rendered = [Rendered("a", [3, 4, 5, 6, 7], [0, 0, 1, 1, 1]), Rendered("b", [8, 9, 10], [0, 1, 1])]
    feats = target_features(target, rendered, batch_tokens=64)
    with torch.no_grad():
        alone = target.model.model(input_ids=torch.tensor([rendered[0].input_ids])).last_hidden_state[0]
    torch.testing.assert_close(feats[0].float(), alone, atol=2e-3, rtol=1e-2)
    write_shard(tmp_path / "shard-00000.safetensors", rendered, feats)
    seqs = load_sequences(tmp_path)
    assert [s.input_ids.tolist() for s in seqs] == [r.input_ids for r in rendered]
    assert seqs[0].loss_mask.tolist() == [False, False, True, True, True]
    assert seqs[1].features.dtype == torch.float16 and seqs[1].features.shape == (3, 32)


def _chat_target():
    target = tiny_target(vocab=32)
    target.tokenizer.chat_template = ("{% for m in messages %}w1 {{ m['content'] }} w2 {% endfor %}"
                                      "{% if add_generation_prompt %}w1 {% endif %}")
    return target


def _greedy_alone(target, prompt: list[int], new: int) -> list[int]:
    out = target.model.generate(input_ids=torch.tensor([prompt]), max_new_tokens=new, do_sample=False, pad_token_id=0)
    return out[0, len(prompt):].tolist()


def test_self_distillation_answers_each_turn_with_the_targets_own_earlier_replies():
    from gumiho.train.distill import batched_replier, regenerate

    target = _chat_target()
    user = lambda text: {"role": "user", "content": text}  # noqa: E731
    reply = {"role": "assistant", "content": "w9 w9"}  # ShareGPT's own reply: replaced by the target's
    convs = [Conversation("a", [user("w3 w4 w5"), reply, user("w6"), reply, user("w7")]),
             Conversation("b", [user("w8"), reply, user("w10 w11 w12 w13")]),
             Conversation("c", [user("w3")])]
    rendered = regenerate(target, convs, batched_replier(target, 4, 2), max_prompt_len=40, turns=2)
    assert [r.id for r in rendered] == ["a", "b", "c", "a/turn2", "b/turn2"]  # a's third turn is past `turns`
    by_id = {r.id: r for r in rendered}
    for r in rendered:
        prompt = r.input_ids[: r.loss_mask.index(1)]
        assert r.loss_mask == [0] * len(prompt) + [1] * 4
        assert r.input_ids[len(prompt):] == _greedy_alone(target, prompt, 4)  # batched, left-padded = one by one
    first_reply = " ".join(f"w{t}" for t in by_id["a"].input_ids[-4:])
    expected = target.tokenizer.apply_chat_template(
        [user("w3 w4 w5"), {"role": "assistant", "content": first_reply}, user("w6")], add_generation_prompt=True)["input_ids"]
    turn2 = by_id["a/turn2"]
    assert turn2.input_ids[: turn2.loss_mask.index(1)] == expected


def test_self_distillation_stops_a_conversation_at_its_first_prompt_that_is_too_long():
    from gumiho.train.distill import batched_replier, regenerate

    target = _chat_target()
    user = lambda text: {"role": "user", "content": text}  # noqa: E731
    reply = {"role": "assistant", "content": "w9"}
    convs = [Conversation("long", [user(" ".join(["w5"] * 12))]),
             Conversation("short", [user("w5"), reply, user(" ".join(["w6"] * 6))])]
    rendered = regenerate(target, convs, batched_replier(target, 3, 4), max_prompt_len=12, turns=2)
    assert [r.id for r in rendered] == ["short"]  # its second prompt (6 + 3 reply + template tokens) is too long


@pytest.mark.parametrize("method", ["ar", "lookup", "recycle"])
def test_replies_written_by_the_engine_equal_the_batched_greedy_replies(method):
    """`prepare --engine METHOD`: one prompt at a time through the decoding loop, greedy speculation included, gives
    the target's greedy replies (its end-of-turn token kept), as the batches do."""
    from gumiho.train.distill import batched_replier, engine_replier

    target = _chat_target()
    prompts = [[5, 6, 7, 5, 6], [8, 9], [5, 6, 7, 5, 6, 7, 5]]  # repeats give lookup something to propose
    expected = batched_replier(target, 10, 3)(prompts)
    target.eos_ids = {expected[1][3]}  # the second reply ends early, at its end-of-turn token
    expected = batched_replier(target, 10, 3)(prompts)
    assert len(expected[1]) == 4 and any(len(r) == 10 for r in expected)
    assert engine_replier(target, method, 10)(prompts) == expected


def test_engine_replies_need_an_exact_method_with_its_weights():
    from gumiho.errors import GumihoError
    from gumiho.train.distill import engine_replier

    target = _chat_target()
    with pytest.raises(GumihoError, match="no trained gumiho drafter ships for tiny"):
        engine_replier(target, "gumiho", 4)
    with pytest.raises(GumihoError, match="exact at T = 0"):
        engine_replier(target, "mjsd", 4)


def test_jsonl_training_data_in_three_forms(tmp_path):
    lines = [
        _record("sg_0", ("human", "q1"), ("gpt", "a1")),
        {"messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "q2"},
                      {"role": "assistant", "content": "a2"}]},
        {"question_id": 7, "turns": ["q3", "and then?"]},
        {"prompt": "q4"},
        {"prompt": "   "},  # unusable: dropped
        {"messages": [{"role": "user", "content": "x"}, {"role": "user", "content": "y"}]},  # two user turns in a row
        {"conversations": ["not a turn"]},
        {"messages": "not a list"},
    ]
    path = tmp_path / "mine.jsonl"
    path.write_text("\n".join(json.dumps(line) for line in lines) + "\n\n")
    loaded = load_conversations(path)
    assert [c.id for c in loaded] == ["sg_0", "2", "7", "4"]  # an id, else the question id, else the line number
    assert loaded[1].messages == [{"role": "user", "content": "q2"}, {"role": "assistant", "content": "a2"}]
    assert loaded[2].messages == [{"role": "user", "content": "q3"}, {"role": "user", "content": "and then?"}]
    assert render(loaded[3], CharChatML(), 64, IM_END) is None  # no reply to learn from without self-distillation


def test_jsonl_lines_end_only_at_newlines(tmp_path):
    """JSON written with ensure_ascii=False keeps U+2028 and U+0085 raw inside strings: they are text, not line ends
    (str.splitlines would cut the record there)."""
    content = "one\u2028two\x85three\x0cfour\rfive"
    path = tmp_path / "raw.jsonl"
    path.write_text(json.dumps({"prompt": content}, ensure_ascii=False) + "\r\n" + json.dumps({"prompt": "b"}) + "\n",
                    encoding="utf-8")
    loaded = load_conversations(path)
    assert [c.messages[0]["content"] for c in loaded] == [content, "b"]
    assert [r.turns for r in read_prompt_file(path)] == [[content], ["b"]]


@pytest.mark.parametrize("text, message", [
    ('{"prompt": "ok"}\n{"prompt": "cut', "mine.jsonl line 2 is not JSON"),
    ('["a list"]', "mine.jsonl line 1 is not a JSON object"),
    ('{"text": "hi"}', "mine.jsonl line 1: expected 'conversations', 'messages', 'prompt' or 'turns'"),
    ('{"prompt": ""}', "mine.jsonl holds no usable conversations"),
])
def test_bad_jsonl_training_data_names_the_file_and_line(tmp_path, text, message):
    from gumiho.errors import GumihoError

    path = tmp_path / "mine.jsonl"
    path.write_text(text)
    with pytest.raises(GumihoError, match=re.escape(message)):
        load_conversations(path)
    with pytest.raises(GumihoError, match="cannot read training data"):
        load_conversations(tmp_path / "missing.jsonl")


def test_prepare_writes_resumable_shards_of_self_distilled_turns(tmp_path):
    from gumiho.train.prepare import PrepareConfig, prepare

    target = _chat_target()
    data = tmp_path / "chats.jsonl"
    chats = [{"id": f"c{i}", "messages": [{"role": "user", "content": f"w{3 + i % 5} w4"},
                                          {"role": "assistant", "content": "w5 w6"}, {"role": "user", "content": "w7"}]}
             for i in range(12)]
    data.write_text("".join(json.dumps(chat) + "\n" for chat in chats))
    config = PrepareConfig(out=str(tmp_path / "out"), data=str(data), conversations=12, shard_size=5, max_new_tokens=3,
                           gen_batch=4, turns=2, heldout_percent=0.0)
    out = prepare(config, target)
    shards = sorted(out.glob("shard-*.safetensors"))
    first = load_sequences(out)
    assert len(shards) == 3 and len(first) == 24  # 5 + 5 + 2 conversations, two replies each
    assert sorted(json.loads(line)["id"] for line in (out / "prompts.jsonl").read_text().splitlines()) == \
        sorted(chat["id"] for chat in chats)
    assert all(s.loss_mask.sum() == 3 for s in first)  # the target's own 3-token replies, not "w5 w6"
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["recipe"]["turns"] == 2 and list(manifest["shards"]) == [p.name for p in shards]
    assert manifest["tokens"] == sum(len(s.input_ids) for s in first) and manifest["reply_tokens"] == 24 * 3
    assert [len(shard["sequences"]) for shard in manifest["shards"].values()] == [10, 10, 4]
    assert {name.split("/")[0] for name in manifest["shards"]["shard-00002.safetensors"]["sequences"]} <= \
        {chat["id"] for chat in chats}

    kept = {p.name: p.stat().st_mtime_ns for p in shards[:2]}
    shards[2].unlink()  # the process died before its last shard
    prepare(config, target)
    assert {p.name: p.stat().st_mtime_ns for p in shards[:2]} == kept and shards[2].exists()
    again = load_sequences(out)
    assert [s.input_ids.tolist() for s in again] == [s.input_ids.tolist() for s in first]
    assert json.loads((out / "manifest.json").read_text()) == manifest  # the same data, the same digests


def test_prepare_without_self_distillation_needs_replies(tmp_path):
    from gumiho.errors import GumihoError
    from gumiho.train.prepare import PrepareConfig, prepare

    data = tmp_path / "prompts.jsonl"
    data.write_text('{"prompt": "w3 w4"}\n')
    config = PrepareConfig(out=str(tmp_path / "out"), data=str(data), distill=False, heldout_percent=0.0)
    with pytest.raises(GumihoError, match="no assistant replies, which --no-distill needs"):
        prepare(config, _chat_target())


def test_long_prompts_are_generated_in_smaller_batches():
    from gumiho.train.distill import SIZED_FOR, length_batches

    lengths = [10, 900, 20, 250, 600, 30, 1000, 40]
    batches = length_batches(lengths, batch_size=4, max_new_tokens=100)
    assert sorted(i for b in batches for i in b) == list(range(8))
    assert [[lengths[i] for i in b] for b in batches] == [[10, 20, 30, 40], [250, 600], [900], [1000]]
    for b in batches:
        assert len(b) <= 4 and len(b) * (max(lengths[i] for i in b) + 100) <= 4 * (SIZED_FOR + 100)


def test_refeature_gives_the_int4_paths_own_features_for_the_same_conversations(tmp_path):
    from gumiho.int4 import int4_available
    from gumiho.profile import ExecPath, target_for
    from gumiho.train.data import Rendered
    from gumiho.train.prepare import refeature

    if not int4_available():
        pytest.skip("no 4-bit kernel on this machine")
    target = tiny_target(vocab=32)
    rendered = [Rendered("a/0", [3, 4, 5, 6, 7, 9], [0, 0, 1, 1, 1, 1]), Rendered("b/0", [8, 9, 10], [0, 1, 1])]
    source = tmp_path / "fp32"
    source.mkdir()
    (source / "prepare.json").write_text(json.dumps({"split": "train", "turns": 1}))
    write_shard(source / "shard-00000.safetensors", rendered, target_features(target, rendered))
    int4 = target_for(target, ExecPath("int4", "lean", pack=False))
    out = refeature(source, tmp_path / "int4", int4)

    again, before = load_sequences(out), load_sequences(source)
    assert [(s.input_ids.tolist(), s.loss_mask.tolist()) for s in again] == \
        [(s.input_ids.tolist(), s.loss_mask.tolist()) for s in before]
    for seq in again:  # what the engine's int4 forward gives, not the fp32 model's
        with torch.inference_mode():
            engine = int4.features(seq.input_ids, int4.new_cache(), prefill=True).to(torch.float16)
        assert torch.equal(seq.features, engine)
    fp32, four_bit = torch.cat([s.features for s in before]).float(), torch.cat([s.features for s in again]).float()
    assert not torch.equal(fp32, four_bit) and torch.cosine_similarity(fp32, four_bit, -1).min() > 0.95
    recipe = json.loads((out / "manifest.json").read_text())["recipe"]
    assert recipe["features_path"] == "int4" and recipe["features_from"] == str(source) and recipe["turns"] == 1

    shard = out / "shard-00000.safetensors"
    stamp = shard.stat().st_mtime_ns
    refeature(source, out, int4)  # resumes: a finished shard is kept
    assert shard.stat().st_mtime_ns == stamp
