"""The `python -m gumiho generate` command: output contract, exactness through the CLI, bad input."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from gumiho.__main__ import main
from gumiho.drafters import new_drafter
from gumiho.errors import GumihoError
from gumiho.prompts import PromptRecord, read_prompt_file, read_prompts

from .conftest import tiny_target

PROMPTS = ["Name three primary colors.", "What is 12 times 7? Answer briefly."]


def run_cli(capsys, *args: str) -> tuple[int, str, str]:
    code = main(["generate", *args])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.slow
def test_json_output_and_exactness_through_the_cli(capsys, tmp_path):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("\n".join(json.dumps({"turns": [p, "second turn"]}) for p in PROMPTS) + "\n")
    results = {}
    for method in ("ar", "eagle2", "gumiho"):
        # fp32: where greedy speculative output is exactly AR's (bf16, the automatic choice on some CPUs, is equal
        # only up to rounding)
        args = ["--method", method, "--prompts", str(prompts), "--max-new-tokens", "24", "--json", "--no-fta",
                "--dtype", "float32"]
        if method == "gumiho":
            args.append("--trace")
        code, out, err = run_cli(capsys, *args)
        assert code == 0, err
        lines = [json.loads(line) for line in out.splitlines()]
        assert [r["prompt"] for r in lines] == PROMPTS
        for record in lines:
            for key in ("method", "prompt", "text", "new_tokens", "token_ids", "cycles", "tau", "wall_s",
                        "tokens_per_s"):
                assert key in record
            assert record["method"] == method and record["new_tokens"] == len(record["token_ids"]) <= 24
            assert ("steps" in record) == (method == "gumiho")
        results[method] = [r["token_ids"] for r in lines]
    assert results["eagle2"] == results["ar"] and results["gumiho"] == results["ar"]


@pytest.mark.parametrize("args,message", [
    (["--prompt", ""], "the prompt is empty"),
    (["--prompt", "   "], "the prompt is empty"),
    (["--prompt", "hi", "--method", "beam"], "unknown method"),
    (["--prompt", "hi", "--temperature", "-0.5"], "temperature must be >= 0"),
    (["--prompt", "hi", "--top-p", "0"], "top-p must be in (0, 1]"),
    (["--prompt", "hi", "--top-p", "1.5"], "top-p must be in (0, 1]"),
    (["--prompt", "hi", "--max-new-tokens", "0"], "max-new-tokens must be >= 1"),
    (["--prompts", "/nonexistent/prompts.jsonl"], "cannot read prompts file"),
    ([], "give --prompt TEXT or --prompts FILE.jsonl"),
    (["--prompt", "hi", "--model", "/no/such/model"], "no model folder /no/such/model"),
    (["--prompt", "hi", "--model", "tests"], "tests is not a model folder (no config.json)"),
])
def test_bad_input_fails_fast_with_one_line(capsys, args, message):
    code, out, err = run_cli(capsys, *args)
    assert code == 2 and out == ""
    assert err.strip().splitlines() == [err.strip()] and message in err


def test_malformed_prompts_file(capsys, tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"turns": ["ok"]}\nnot json\n')
    code, _, err = run_cli(capsys, "--prompts", str(bad))
    assert code == 2 and "bad.jsonl:2" in err


def test_prompt_files_hold_turns_or_a_prompt(tmp_path):
    path = tmp_path / "prompts.jsonl"
    path.write_text('{"question_id": 7, "turns": ["first", "second"]}\n\n{"prompt": "only"}\n')
    assert read_prompts(path) == ["first", "only"]
    assert read_prompt_file(path) == [PromptRecord("7", ["first", "second"]), PromptRecord("3", ["only"])]
    assert read_prompt_file(path, limit=1) == [PromptRecord("7", ["first", "second"])]
    path.write_text('{"prompt": " "}\n')
    with pytest.raises(GumihoError, match=r"prompts.jsonl:1: expected a JSON object with 'turns' \(a non-empty"):
        read_prompts(path)


@pytest.mark.slow
def test_drafter_that_does_not_fit_the_target(capsys, tmp_path):
    folder = tmp_path / "tiny-drafter"
    new_drafter("gumiho", tiny_target().model.config).save_pretrained(folder)
    code, _, err = run_cli(capsys, "--prompt", "hi", "--drafter", str(folder))
    assert code == 2 and "does not fit the target" in err


@pytest.mark.slow
def test_prompt_longer_than_the_context(capsys):
    code, _, err = run_cli(capsys, "--method", "ar", "--no-chat", "--prompt", "hello " * 9000)
    assert code == 2 and "the model's context is 8192" in err


def test_no_module_imports_the_entry_point():
    """Shared command-line helpers live in gumiho/cli.py, so `python -m gumiho` stays a leaf."""
    package = Path(__file__).resolve().parents[1] / "gumiho"
    importers = [path.relative_to(package).as_posix() for path in package.rglob("*.py")
                 if re.search(r"^\s*from (gumiho|\.+)\.?__main__ import", path.read_text(), re.MULTILINE)]
    assert importers == []


def test_exit_status_and_stderr_from_a_real_process():
    proc = subprocess.run([sys.executable, "-m", "gumiho", "generate", "--prompt", "hi", "--top-p", "2"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.strip() == "error: top-p must be in (0, 1], got 2.0"
