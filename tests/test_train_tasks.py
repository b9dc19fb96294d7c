"""Task-shaped prompts (`python -m gumiho.train prompts`): the task of a first turn, the benchmark overlap check,
the balanced choice and the command line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gumiho.train.__main__ import main
from gumiho.train.data import Conversation
from gumiho.train.tasks import SUMMARY_REQUESTS, benchmark_ngrams, overlapping, summary_prompts, task_of, task_prompts

ROOT = Path(__file__).resolve().parent.parent
ARTICLE = " ".join(f"word{i}" for i in range(80))


@pytest.mark.parametrize("prompt, task", [
    (f"Summarize the following article: {ARTICLE}", "summary"),
    ("Summarize the plot of Hamlet.", None),  # nothing given to summarise: too short for the CNN/DM kind
    ("Write a python function that reverses a linked list.", "code"),
    ("Fix this:\n```\nx = [1, 2\n```", "code"),
    ("Tom has 3 apples and buys 5 more. How many apples does he have now?", "math"),
    ("What is 12 * 7?", "math"),
    ("Who wrote the novel Dracula?", "question"),
    ("Give three tips for staying healthy.", "instruction"),
    ("Compose a short poem about autumn leaves.", "instruction"),
    ("hello there my friend", None),
    ("Decode this: " + "QUJD" * 20, None),  # pasted data, not a request in words
])
def test_task_of_a_first_turn(prompt, task):
    assert task_of(prompt) == task


def test_a_prompt_sharing_a_run_of_eight_words_with_a_benchmark_prompt_is_dropped(tmp_path):
    bench = tmp_path / "set.jsonl"
    bench.write_text(json.dumps({"turns": ["Who played Anna in the series Once Upon a Time on ABC?"]}) + "\n")
    banned = benchmark_ngrams([bench])
    assert overlapping("tell me: who played anna in the series once upon a time, please", banned)
    assert not overlapping("Who played Anna in the series Frozen?", banned)  # seven words shared at most


def test_the_shipped_benchmark_prompts_are_all_caught():
    files = sorted((ROOT / "data" / "benchmarks").glob("*.jsonl"))
    assert len(files) == 6
    banned = benchmark_ngrams(files)
    from gumiho.prompts import read_prompt_file

    long_turns = [t for f in files for r in read_prompt_file(f) for t in r.turns if len(t.split()) >= 8]
    assert long_turns and all(overlapping(t, banned) for t in long_turns)


def test_task_prompts_are_balanced_distinct_first_parts_without_benchmark_text():
    def conv(cid, prompt):
        return Conversation(cid, [{"role": "user", "content": prompt}, {"role": "assistant", "content": "ok"}])

    conversations = [conv(f"q{i}_0", f"Who founded city number {i}?") for i in range(5)]
    conversations += [conv(f"c{i}", f"Write a python script that prints {i}.") for i in range(2)]
    conversations += [conv("dup_0", "Who founded city number 1?"),  # the same prompt again
                      conv("later_1", "Who founded city number 9?"),  # a later part of a cut chat
                      conv("bench_0", "Write a python script that prints the sum of the list 1 2 3 now.")]
    banned = {("python", "script", "that", "prints", "the", "sum", "of", "the")}
    records = task_prompts(conversations, per_task=3, banned=banned)
    assert [r["task"] for r in records] == ["code", "question", "code", "question", "question"]
    assert len({r["prompt"] for r in records}) == 5
    assert {r["id"] for r in records}.isdisjoint({"dup_0", "later_1", "bench_0"})
    assert task_prompts(conversations, per_task=3, banned=banned, tasks=["code"]) == \
        [r for r in records if r["task"] == "code"]


def test_prompts_command_writes_the_training_side_only(tmp_path, capsys):
    from gumiho.train.data import is_heldout

    data = tmp_path / "chats.jsonl"
    lines = [{"id": f"x{i}_0", "prompt": f"Who invented machine number {i}?"} for i in range(60)]
    data.write_text("".join(json.dumps(line) + "\n" for line in lines))
    out = tmp_path / "prompts.jsonl"
    assert main(["prompts", "--data", str(data), "--out", str(out), "--per-task", "100",
                 "--heldout-percent", "20"]) == 0
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert records and all(r["task"] == "question" and not is_heldout(r["id"], 20) for r in records)
    assert len(records) == sum(not is_heldout(line["id"], 20) for line in lines) < 60
    assert f"{len(records)} prompts" in capsys.readouterr().out
    # A larger choice less an earlier, smaller one: only prompts that choice did not take.
    small, rest = tmp_path / "small.jsonl", tmp_path / "rest.jsonl"
    assert main(["prompts", "--data", str(data), "--out", str(small), "--per-task", "10",
                 "--heldout-percent", "20"]) == 0
    assert main(["prompts", "--data", str(data), "--out", str(rest), "--per-task", "100",
                 "--heldout-percent", "20", "--exclude", str(small)]) == 0
    ids = {json.loads(line)["id"] for line in small.read_text().splitlines()}
    left = {json.loads(line)["id"] for line in rest.read_text().splitlines()}
    assert len(ids) == 10 and left == {r["id"] for r in records} - ids


def test_prompts_command_wants_some_prompts(tmp_path, capsys):
    assert main(["prompts", "--out", str(tmp_path / "p.jsonl"), "--per-task", "0"]) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--per-task must be at least 1 (or 0 with --summaries)" in err[0]


def test_prompts_command_without_benchmark_files_says_so(tmp_path, capsys):
    assert main(["prompts", "--out", str(tmp_path / "p.jsonl"), "--benchmarks", str(tmp_path)]) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no benchmark .jsonl files" in err[0]


def test_summary_tasks_are_long_prose_replies_under_a_request_to_summarise_them():
    from gumiho.train.data import is_heldout

    prose = " ".join(f"Sentence {i} tells what happened in the town that day." for i in range(30))  # 300 words

    def chat(cid: str, reply: str) -> Conversation:
        return Conversation(cid, [{"role": "user", "content": "Tell me a story."}, {"role": "assistant", "content": reply}])

    listed = "\n".join(f"{i}. Item number {i} of a long list of things to do today." for i in range(30))
    conversations = [chat("prose_0", prose), chat("short_0", "A short reply of a few words."),
                     chat("listed_0", listed), chat("code_0", prose + "\n```\nx = 1\n```"),
                     chat("bench_0", prose + " the quick brown fox jumps over the lazy dog"),
                     chat("taken_0", prose), chat("other_3", prose.replace("town", "city"))]
    banned = {("the", "quick", "brown", "fox", "jumps", "over", "the", "lazy")}
    records = summary_prompts(conversations, 10, banned, skip={"taken_0"})
    assert sorted(r["id"] for r in records) == ["other_3-summary", "prose_0-summary"]
    for record in records:
        text = prose if record["id"].startswith("prose") else prose.replace("town", "city")
        assert record["task"] == "summary" and record["prompt"] in {r.format(text=text) for r in SUMMARY_REQUESTS}
        source = record["id"].removesuffix("-summary")
        assert is_heldout(record["id"], 20) == is_heldout(source, 20)  # its conversation's side of the split
    assert len(summary_prompts(conversations, 1, banned)) == 1
