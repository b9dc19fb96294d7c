"""scripts/lent_gpu.sh, the parts that run here: usage errors, and the drafters' weights brought back into the tree
after `pack` moved them out (the tree travels with every copy to the GPU, and must stay under 64 MiB)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
KINDS = ("eagle2", "gumiho", "hydra", "medusa")


def run(repo: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(repo / "scripts" / "lent_gpu.sh"), *args], capture_output=True, text=True)


def repo_with_weights_packed(tmp_path: Path) -> Path:
    """A repository whose drafters' weights lie where `pack` moves them: .gpu/hold/<their folder>/."""
    (tmp_path / "scripts").mkdir()
    shutil.copy(ROOT / "scripts" / "lent_gpu.sh", tmp_path / "scripts")
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    for kind in KINDS:
        folder = f"assets/drafters/smollm2-135m-{kind}"
        (tmp_path / folder).mkdir(parents=True)
        (tmp_path / folder / "config.json").write_text("{}")
        (tmp_path / ".gpu/hold" / folder).mkdir(parents=True)
        (tmp_path / ".gpu/hold" / folder / "model.safetensors").write_bytes(kind.encode())
    for folder in ("assets/bench", "assets/traces"):  # folders the round never reads, left here by `pack`
        (tmp_path / ".gpu/hold" / folder).mkdir(parents=True)
        (tmp_path / ".gpu/hold" / folder / "report.md").write_text(folder)
    return tmp_path


def weights_in_tree(repo: Path) -> dict[str, bytes]:
    return {kind: (repo / f"assets/drafters/smollm2-135m-{kind}/model.safetensors").read_bytes()
            for kind in KINDS if (repo / f"assets/drafters/smollm2-135m-{kind}/model.safetensors").is_file()}


def test_restore_brings_back_the_two_initial_drafters_then_all(tmp_path):
    repo = repo_with_weights_packed(tmp_path)
    assert run(repo, "restore").returncode == 0
    assert weights_in_tree(repo) == {"eagle2": b"eagle2", "gumiho": b"gumiho"}  # what the third copy carries
    assert not (repo / "assets/bench").exists()  # the round's copies travel without them
    (repo / "assets/traces").mkdir()  # checked out again meanwhile: never overwritten
    done = run(repo, "restore", "all")
    assert done.returncode == 0
    assert weights_in_tree(repo) == {kind: kind.encode() for kind in KINDS}
    assert (repo / "assets/bench/report.md").read_text() == "assets/bench"
    assert not (repo / "assets/traces/report.md").exists() and (repo / ".gpu/hold/assets/traces/report.md").is_file()
    assert "assets/traces is in the tree again" in done.stderr


def test_bad_use_is_one_line_and_exit_2(tmp_path):
    repo = repo_with_weights_packed(tmp_path)
    for args in ((), ("bogus",), ("start",), ("unpack",)):
        done = run(repo, *args)
        assert done.returncode != 0 and len(done.stderr.strip().splitlines()) == 1, (args, done.stderr)
    assert run(repo, "bogus").returncode == 2
