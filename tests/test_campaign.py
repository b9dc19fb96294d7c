"""The background drafter campaign (scripts/cpu_campaign.sh): one at a time, and paused while a benchmark measures."""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gumiho.bench.machine import campaign_paused

ROOT = Path(__file__).resolve().parents[1]


def state(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]


@pytest.fixture
def campaign(tmp_path):
    """A stand-in campaign in its own process group, its pid file in tmp_path: (worker, pid file)."""
    worker = subprocess.Popen([sys.executable, "-c", "import time\nwhile True: time.sleep(0.01)"],
                              start_new_session=True)
    pid_file = tmp_path / "campaign.pid"
    pid_file.write_text(f"{os.getpgid(worker.pid)}\n")
    yield worker, pid_file
    worker.kill()
    worker.wait()


def test_a_benchmark_stops_the_campaigns_process_group_and_lets_it_go_on(campaign):
    worker, pid_file = campaign
    with campaign_paused(pid_file) as paused:
        time.sleep(0.2)
        assert paused and state(worker.pid) == "T"
    time.sleep(0.2)
    assert state(worker.pid) != "T"


def test_overlapping_holders_continue_the_campaign_only_when_the_last_one_ends(campaign, tmp_path):
    """A benchmark (campaign_paused) and a command under scripts/campaign_hold.sh, one inside the other's time."""
    worker, pid_file = campaign
    with campaign_paused(pid_file) as paused:
        held = subprocess.run(["bash", str(ROOT / "scripts" / "campaign_hold.sh"), "true"],
                              env={**os.environ, "RUNS": str(tmp_path)}, capture_output=True, text=True)
        assert held.returncode == 0 and "paused" in held.stderr and "goes on" not in held.stderr
        time.sleep(0.2)
        assert paused and state(worker.pid) == "T"  # the benchmark still measures
    time.sleep(0.2)
    assert state(worker.pid) != "T"


def test_no_campaign_or_a_stale_file_changes_nothing(tmp_path):
    with campaign_paused(tmp_path / "missing.pid") as paused:
        assert not paused
    stale = tmp_path / "stale.pid"
    stale.write_text("not a number")
    with campaign_paused(stale) as paused:
        assert not paused


def test_a_second_campaign_says_another_holds_the_lock_and_exits_2(tmp_path):
    runs = tmp_path / "runs"
    runs.mkdir()
    with open(runs / "campaign.lock", "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        done = subprocess.run(["bash", str(ROOT / "scripts" / "cpu_campaign.sh")], capture_output=True, text=True,
                              env={**os.environ, "RUNS": str(runs), "PY": sys.executable}, timeout=60)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [f"error: another campaign holds {runs}/campaign.lock"]
    assert not (runs / "campaign.pid").exists()


def test_a_corrupt_shard_is_skipped_with_a_line_naming_it(tmp_path, caplog):
    import torch

    from gumiho.train.data import Rendered
    from gumiho.train.features import load_sequences, write_shard

    rendered = [Rendered("a", [3, 4, 5], [0, 1, 1])]
    write_shard(tmp_path / "shard-00000.safetensors", rendered, [torch.zeros(3, 8)])
    (tmp_path / "shard-00001.safetensors").write_bytes(b"\x00\x01 not a shard")
    sequences = load_sequences(tmp_path)
    assert [s.input_ids.tolist() for s in sequences] == [[3, 4, 5]]
    assert "shard-00001.safetensors" in caplog.text and "skipping" in caplog.text


def test_a_corrupt_checkpoint_is_set_aside_and_said_never_silently_reused(tmp_path, caplog):
    import torch

    from gumiho.train.trainer import load_checkpoint

    path = tmp_path / "checkpoint.pt"
    assert load_checkpoint(path, torch.device("cpu")) is None and caplog.text == ""  # none yet: nothing to say
    path.write_bytes(b"PK\x03\x04 truncated")
    assert load_checkpoint(path, torch.device("cpu")) is None
    assert not path.exists() and (tmp_path / "checkpoint.corrupt").exists()
    assert "checkpoint.pt" in caplog.text and "starting this run over" in caplog.text


def test_a_full_disk_stops_the_run_and_keeps_the_last_good_checkpoint(tmp_path, monkeypatch):
    import errno

    import pytest
    import torch

    from gumiho.errors import GumihoError
    from gumiho.train import trainer

    path = tmp_path / "checkpoint.pt"
    path.write_bytes(b"the last good one")

    def full(obj, f):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(torch, "save", full)
    state = type("State", (), {"drafter": torch.nn.Linear(2, 2), "optimizer": torch.optim.SGD([torch.zeros(1)], 0.1),
                               "scheduler": torch.optim.lr_scheduler.LambdaLR(torch.optim.SGD([torch.zeros(1)], 0.1),
                                                                              lambda s: 1.0),
                               "progress": lambda self: {}})()
    with pytest.raises(GumihoError, match="No space left.*last good checkpoint"):
        trainer.save_checkpoint(path, trainer.TrainConfig(drafter="eagle2", data="d", out="o"), state)
    assert path.read_bytes() == b"the last good one" and not path.with_suffix(".tmp").exists()


def test_a_step_of_the_campaign_itself_pauses_nothing(tmp_path):
    """The campaign's own steps build engines (tau, calibration): stopping their own process group would hang them."""
    own = tmp_path / "campaign.pid"
    own.write_text(f"{os.getpgrp()}\n")
    with campaign_paused(own) as paused:
        assert not paused


def test_the_machine_profile_is_measured_with_the_campaign_paused(campaign, tmp_path, monkeypatch):
    """A profile measured under the campaign's load would be cached, and would misjudge every later run."""
    from gumiho import profile as prof
    from tests.conftest import random_drafter, tiny_target, use_cache

    worker, pid_file = campaign
    monkeypatch.setenv("GUMIHO_CAMPAIGN_PID", str(pid_file))
    use_cache(monkeypatch, tmp_path / "cache")
    seen = []

    def measure(target, drafters, **kwargs):
        seen.append(state(worker.pid))
        return real(target, drafters, repeats=1, top_ks=(2,), progress=False)

    real = prof.measure
    monkeypatch.setattr(prof, "measure", measure)
    target = tiny_target(seed=1, vocab=32)
    prof.load_or_measure(target, {"eagle2": random_drafter("eagle2", target, seed=1)}, progress=False)
    time.sleep(0.2)
    assert seen == ["T"] and state(worker.pid) != "T"


STAND_IN_PY = """#!/usr/bin/env bash
# Records each `python -m gumiho.train ...` call and writes what the next step reads; other calls run Python.
echo "$*" >> "$CALLS"
case "$*" in *ensure_default_model*) exit 0;; esac
if [ "$1" = -m ] && [ "$2" = gumiho.train ]; then
    shift 2
    out="" prev=""
    for arg in "$@"; do [ "$prev" = --out ] && out=$arg; prev=$arg; done
    case "$1" in
        prompts) echo '{"id": "a_0", "prompt": "Who?"}' > "$out";;
        prepare|refeature|--drafter) mkdir -p "$out";;
        eval) case "$out:$NEW_WINS" in
                  *eval-new.json:1) echo '{"tau": {"p": {"tau_mean": 2.5}}, "chain_accuracy": [0.6]}' > "$out";;
                  *) echo '{"tau": {"p": {"tau_mean": 2.0}}, "chain_accuracy": [0.5]}' > "$out";;
              esac;;
    esac
    exit 0
fi
if [ "$1" = -m ] && [ "$2" = gumiho ] && [ "$3" = calibrate ]; then exit 0; fi
exec PYTHON "$@"
"""


def _campaign_calls(tmp_path, **settings) -> list[str]:
    """The gumiho and gumiho.train calls of one round of the campaign with a stand-in Python (an even result: nothing
    ships; NEW_WINS=1: every new drafter wins)."""
    stand_in = tmp_path / "py"
    stand_in.write_text(STAND_IN_PY.replace("PYTHON", sys.executable))
    stand_in.chmod(0o755)
    calls = tmp_path / "calls.txt"
    env = {**os.environ, "PY": str(stand_in), "CALLS": str(calls), "RUNS": str(tmp_path / "runs"),
           "CACHE": str(tmp_path / "cache"), "CHECKPOINT_MINUTES": "1", **settings}
    done = subprocess.run(["bash", str(ROOT / "scripts" / "cpu_campaign.sh")], capture_output=True, text=True,
                          env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    return [line for line in calls.read_text().splitlines() if line.startswith(("-m gumiho.train", "-m gumiho "))]


def _call(calls: list[str], *words: str) -> list[str]:
    return [c for c in calls if all(w in c.split() for w in words)]


def test_the_default_round_distills_sharegpt_conversations_in_batches(tmp_path):
    calls = _campaign_calls(tmp_path)
    cache = tmp_path / "cache"
    (heldout,), (train,) = _call(calls, "prepare", "heldout"), _call(calls, "prepare", "train")
    assert "--engine" not in train and "--data" not in train and f"--out {cache}/campaign-train" in train
    assert "--turns 3" in train and "--skip 12288" in train
    assert not _call(calls, "prompts") and not _call(calls, "refeature")
    for drafter in ("gumiho", "eagle2"):
        (run,) = _call(calls, "--drafter", drafter)
        assert f"--data {cache}/campaign-train " in run and run.split("--out ")[1].split()[0].endswith("-c2048")


def test_int4_features_of_batched_replies_are_recomputed(tmp_path):
    calls = _campaign_calls(tmp_path, FEATURES="int4")
    cache = tmp_path / "cache"
    assert [c.split("--out ")[1].split()[0] for c in _call(calls, "refeature")] == \
        [f"{cache}/campaign-train-int4", f"{cache}/campaign-heldout-int4"]
    assert all(f"--data {cache}/campaign-train-int4 " in c for c in _call(calls, "--drafter"))


def test_task_shaped_prompts_answered_by_the_engine_on_the_int4_path(tmp_path):
    calls = _campaign_calls(tmp_path, TASKS="1", DISTILL="gumiho", FEATURES="int4", PER_TASK="50")
    cache = tmp_path / "cache"
    prompts = _call(calls, "prompts")
    assert [c.split("--split ")[1].split()[0] for c in prompts] == ["train", "heldout"]
    assert all("--per-task 50" in c for c in prompts)
    (heldout,), (train,) = _call(calls, "prepare", "heldout"), _call(calls, "prepare", "train")
    assert f"--data {cache}/task50-prompts-heldout.jsonl" in heldout and f"{cache}/task50-heldout-gumiho-int4" in heldout
    assert f"--data {cache}/task50-prompts-train.jsonl" in train and f"{cache}/task50-train-gumiho-int4" in train
    assert all("--engine gumiho --dtype int4" in c for c in (heldout, train))
    assert "--turns 1" in train and "--skip 0" in train
    assert not _call(calls, "refeature")  # the engine's path wrote the features already
    for drafter in ("gumiho", "eagle2"):
        (run,) = _call(calls, "--drafter", drafter)
        assert f"--data {cache}/task50-train-gumiho-int4 " in run
        assert run.split("--out ")[1].split()[0].endswith("-c2048-tasks50-gumiho-int4")
        assert all("--dtype int4" in c and f"--heldout {cache}/task50-heldout-gumiho-int4" in c
                   for c in _call(calls, "eval") if drafter in c.split("--out ")[1])


def test_another_per_task_is_another_data_set(tmp_path):
    (a,) = _call(_campaign_calls(tmp_path, TASKS="1", DISTILL="gumiho", PER_TASK="50"), "prepare", "train")
    (tmp_path / "calls.txt").unlink()
    second = _campaign_calls(tmp_path, TASKS="1", DISTILL="gumiho", PER_TASK="80")
    (b,) = _call(second, "prepare", "train")
    assert "task50-train-gumiho-float32" in a and "task80-train-gumiho-float32" in b
    assert len(_call(second, "prompts")) == 2  # its own prompt files, not the first setting's


def test_a_drafter_that_wins_is_shipped_and_recalibrated_with_the_methods_borrowing_its_weights(tmp_path):
    calls = _campaign_calls(tmp_path, NEW_WINS="1")
    assert [c.split("--dest ")[1].split()[0] for c in _call(calls, "ship")] == \
        ["assets/drafters/smollm2-135m-gumiho", "assets/drafters/smollm2-135m-eagle2"]
    # EAGLE-1 drafts with EAGLE-2's weights (its statistics beside them): a new EAGLE-2 makes them stale too
    assert [c.split("--method ")[1].split()[0] for c in _call(calls, "calibrate")] == ["gumiho", "eagle2", "eagle1"]


def test_drafters_picks_which_drafters_a_round_fine_tunes(tmp_path):
    calls = _campaign_calls(tmp_path, DRAFTERS="eagle2", CE_WEIGHT="1.0")
    (run,) = _call(calls, "--drafter")
    assert "--drafter eagle2" in run and "--ce-weight 1.0" in run
    assert len(_call(calls, "eval")) == 2  # the new drafter and the shipped one, EAGLE-2's only


def test_drafters_naming_no_shipped_drafter_stops_before_any_work(tmp_path):
    calls = tmp_path / "calls.txt"
    env = {**os.environ, "PY": "false", "CALLS": str(calls), "RUNS": str(tmp_path / "runs"),
           "CACHE": str(tmp_path / "cache"), "DRAFTERS": "gumiho medusa2"}
    done = subprocess.run(["bash", str(ROOT / "scripts" / "cpu_campaign.sh")], capture_output=True, text=True,
                          env=env, timeout=60)
    assert done.returncode == 2 and done.stderr.strip().splitlines() == [
        "error: DRAFTERS names medusa2, which has no shipped drafter to start from (gumiho, eagle2)"]
    assert not (tmp_path / "runs").exists()
