"""The bench's optional llama.cpp row (gumiho/bench/reference.py): llama-cpp-python on the embedded model's GGUF
file, from the engine's own prompt ids. Where `llama_cpp` is not installed (it is optional), a stand-in library
checks what the bench hands it and what it makes of the tokens; where it is, the real one runs the real model."""

from __future__ import annotations

import subprocess
import sys
import types

import pytest
import torch

from gumiho.bench import reference as ref_module
from gumiho.bench.datasets import load_questions
from gumiho.bench.harness import BenchSettings, make_variants, run_bench
from gumiho.bench.metrics import add_speedups
from gumiho.bench.reference import LLAMA_CPP, LlamaCppReference, References, llama_cpp_problem, probe_llama_cpp
from gumiho.engine import GenerationConfig
from gumiho.tree import TreeSettings

from .conftest import tiny_engine


class StandIn:
    """`llama_cpp.Llama` as the row uses it: records its arguments, then "generates" a fixed run of tokens."""

    made: list[dict] = []

    def __init__(self, **kwargs):
        StandIn.made.append(kwargs)
        self.calls: list[dict] = []

    def set_seed(self, seed: int) -> None:
        self.seed = seed

    def generate(self, tokens, **sampling):
        self.calls.append({"tokens": list(tokens), **sampling})
        yield from [5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 3, 4]


@pytest.fixture
def stand_in(monkeypatch, tmp_path):
    module = types.ModuleType("llama_cpp")
    module.Llama = StandIn
    StandIn.made = []
    monkeypatch.setitem(sys.modules, "llama_cpp", module)
    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"GGUF")
    monkeypatch.setattr(ref_module, "find_default_gguf", lambda: gguf)
    return gguf


def test_the_row_reads_the_engines_prompt_ids_greedily_and_stops_at_the_limit(stand_in):
    engine = tiny_engine(seed=2)
    row = LlamaCppReference(engine.target)
    ids = engine.target.encode_prompt("w1 w2 w3")
    trace = row.generate("w1 w2 w3", ids, max_new_tokens=6, temperature=0.0, seed=4)
    made, call = StandIn.made[0], row.llm.calls[0]
    assert made["model_path"] == str(stand_in) and made["n_threads"] == torch.get_num_threads()
    assert call["tokens"] == ids and call["temp"] == 0.0 and call["top_k"] == 1 and call["reset"]
    assert trace.method == LLAMA_CPP and trace.token_ids == [5, 6, 7, 8, 9, 10] and trace.finish_reason == "length"
    assert trace.settings.forward == "llama.cpp" and trace.cycles == 5 and trace.wall_s > 0


def test_the_bench_runs_the_row_beside_the_engine_and_compares_it_with_ar(stand_in):
    engine = tiny_engine(seed=2)
    trees = {m: TreeSettings.default(m) for m in ("eagle2", "gumiho")}
    variants = make_variants([LLAMA_CPP, "ar", "gumiho"], trees)
    assert [v.name for v in variants] == ["ar", "gumiho", LLAMA_CPP]
    settings = BenchSettings(datasets=["mt_bench"], limit=2, max_new_tokens=8, warmup=0)
    references = References(engine.target, None)
    rows = add_speedups(run_bench(engine, variants, settings, progress=False, reference=references))
    row = rows[rows["method"] == LLAMA_CPP]
    assert len(row) == 2 and (row["tau"] == 1.0).all() and row["speedup"].notna().all()
    assert row["same_as_ar"].notna().all() and row["agreement"].between(0, 1).all()  # compared with AR's output
    assert len(StandIn.made) == 1  # loaded once, on first use
    prompts = [engine.target.encode_prompt(q.turns[0]) for q in load_questions("mt_bench", limit=2)]
    assert [call["tokens"] for call in references._llama.llm.calls] == prompts  # the engine's own prompt ids


def test_llama_cpp_runs_the_embedded_gguf_from_our_prompt_ids():
    problem = llama_cpp_problem()  # not installed (it is optional), or a build that dies here
    if problem:
        pytest.skip(problem)
    from gumiho.loader import build_engine

    engine = build_engine(threads=2)  # the int4 path on a CPU: llama.cpp's own arithmetic on the same Q4_1 blocks
    ids = engine.target.encode_prompt("Name three primary colours.")
    row = LlamaCppReference(engine.target)
    trace = row.generate("Name three primary colours.", ids, max_new_tokens=24, temperature=0.0, seed=0)
    again = row.generate("Name three primary colours.", ids, max_new_tokens=24, temperature=0.0, seed=0)
    assert trace.token_ids == again.token_ids and 0 < len(trace.token_ids) <= 24  # greedy: the same twice
    assert trace.text.strip() and trace.finish_reason in ("eos", "length")
    ar = engine.generate("", "ar", GenerationConfig(max_new_tokens=24), prompt_ids=ids).token_ids
    assert trace.token_ids[:1] == ar[:1]  # the same Q4_1 weights: at least the first token agrees


def test_the_probe_tells_a_llama_cpp_that_dies_from_one_that_runs(tmp_path):
    def child(returncode: int, stderr: str = ""):
        return lambda command, **kwargs: subprocess.CompletedProcess(command, returncode, "", stderr)

    gguf = tmp_path / "model.gguf"
    assert probe_llama_cpp(gguf, run=child(0)) is None
    died = probe_llama_cpp(gguf, run=child(-4))
    assert "signal 4" in died and "CMAKE_ARGS" in died and "\n" not in died  # SIGILL: the AMX build's death here
    assert probe_llama_cpp(gguf, run=child(-11)) == "llama.cpp died on a two-token probe (signal 11)"
    assert probe_llama_cpp(gguf, run=child(1, "Traceback ...\nValueError: bad file")) == \
        "llama.cpp failed on a two-token probe: ValueError: bad file"


@pytest.mark.parametrize("problem", [None, "llama.cpp died on a two-token probe (signal 4); rebuild it"])
def test_the_row_is_offered_only_where_llama_cpp_runs(monkeypatch, capsys, problem):
    from gumiho.bench import __main__ as cli

    monkeypatch.setattr(cli, "llama_cpp_problem", lambda: problem)
    monkeypatch.setattr(ref_module, "llama_cpp_problem", lambda: problem)
    monkeypatch.setattr(cli, "llama_cpp_available", lambda: True)  # installed
    defaults = cli.build_parser().parse_args(["--quick"])
    cli.bench_settings(defaults)
    assert (LLAMA_CPP in defaults.methods) == (problem is None)
    said = capsys.readouterr().err
    assert said == ("" if problem is None else f"[llama.cpp] row left out: {problem}\n")
    if problem:
        assert cli.main(["--methods", "ar", LLAMA_CPP, "--quick"]) == 2
        err = capsys.readouterr().err
        assert problem in err and err.count("\n") == 1
