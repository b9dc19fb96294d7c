"""Bad input to `python -m gumiho.train`: one line on stderr, non-zero exit, before any model is loaded."""

from __future__ import annotations

import pytest

from gumiho.train.__main__ import main


def _exit_code(argv: list[str]) -> int:
    try:
        return main(argv)
    except SystemExit as exc:  # argparse usage errors
        return int(exc.code)


@pytest.mark.parametrize("argv, message", [
    (["--drafter", "lookahead", "--data", ".", "--out", "x"], "--drafter must be one of medusa, hydra, eagle2, gumiho"),
    (["--drafter", "eagle2", "--data", "no/such/folder", "--out", "x"], "no feature folder no/such/folder"),
    (["--drafter", "eagle2"], "required"),
    (["prepare", "--out", "x", "--split", "test"], "--split must be train or heldout"),
    (["prepare", "--out", "x", "--turns", "0"], "--turns must be at least 1"),
    (["prepare", "--out", "x", "--engine", "mjsd"], "choose one of ar, medusa"),
    (["prepare", "--out", "x", "--engine", "lookup", "--no-distill"], "--engine writes the replies"),
    (["prepare", "--out", "x", "--engine", "hydra", "--model", "some/model"], "no trained hydra drafter ships"),
    (["ship", "--run", "no/such/run", "--dest", "x"], "not a finished training run"),
    (["refeature", "--data", "no/such/folder", "--out", "x"], "no/such/folder holds no feature shards"),
    (["refeature", "--data", "x", "--out", "./x"], "--out must be another folder than --data"),
    (["refeature", "--data", "x", "--out", "y", "--dtype", "int8"], "invalid choice"),
])
def test_bad_input_is_one_line_and_non_zero(capsys, argv, message):
    code = _exit_code(argv)
    err = capsys.readouterr().err.strip()
    assert code != 0
    assert message in err and len(err.splitlines()) == 1


def test_chain_accuracy_refuses_replies_the_target_did_not_write(capsys, tmp_path):
    (tmp_path / "prepare.json").write_text('{"split": "heldout", "distill": false}')
    code = _exit_code(["eval", "--drafter-dir", "assets/drafters/smollm2-135m-eagle2", "--heldout", str(tmp_path)])
    err = capsys.readouterr().err.strip()
    assert code != 0 and "chain accuracy needs the target's own replies" in err and len(err.splitlines()) == 1


def test_every_option_explains_itself_in_help(capsys):
    from dataclasses import fields

    from gumiho.train.prepare import PrepareConfig
    from gumiho.train.trainer import TrainConfig

    for cls in (PrepareConfig, TrainConfig):
        assert all(f.metadata.get("help") for f in fields(cls)), cls.__name__
    assert _exit_code(["prepare", "--help"]) == 0
    assert "user turns answered per conversation" in " ".join(capsys.readouterr().out.split())
