"""The two sets of versions: ranges in requirements.txt (what a Space resolves, on ZeroGPU's own torch) and exact pins
in constraints.txt (what `make` installs and CI tests), kept consistent with each other and with the Space's front
matter."""

from __future__ import annotations

import re
from importlib.metadata import version
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parent.parent
ZEROGPU_TORCH = ("2.8.0", "2.9.1", "2.10.0", "2.11.0")  # hub-docs spaces-zerogpu.md, supported versions
ZEROGPU_PYTHON = ("3.10", "3.12")


def requirements(name: str) -> dict[str, Requirement]:
    out = {}
    for line in (ROOT / name).read_text().splitlines():
        line = line.split("#")[0].strip()
        if line.startswith("-r "):
            out |= requirements(line.split()[1])
        elif line:
            requirement = Requirement(line)
            out[canonicalize_name(requirement.name)] = requirement
    return out


def pins() -> dict[str, Version]:
    return {name: Version(str(r.specifier).removeprefix("==")) for name, r in requirements("constraints.txt").items()}


def front_matter() -> dict[str, str]:
    block = (ROOT / "README.md").read_text().split("---")[1]
    return dict((k.strip(), v.strip().strip('"')) for k, v in (line.split(":", 1) for line in block.strip().splitlines()))


def test_every_requirement_is_pinned_within_its_range():
    pinned = pins()
    for name, requirement in requirements("requirements-dev.txt").items():
        assert name in pinned, f"{name} has no pin in constraints.txt"
        assert requirement.specifier.contains(pinned[name], prereleases=True), f"{name} {pinned[name]} outside {requirement}"


def test_zerogpu_can_pick_its_torch_and_python():
    torch = requirements("requirements.txt")["torch"]
    assert all(torch.specifier.contains(v) for v in ZEROGPU_TORCH), torch
    meta = front_matter()
    assert meta["python_version"] in ZEROGPU_PYTHON and Version(meta["python_version"]) >= Version("3.11")  # transformers 5
    assert meta["sdk"] == "gradio" and Version(meta["sdk_version"]) == pins()["gradio"]


def test_spaces_is_never_pinned():  # the platform installs its own
    assert "spaces" not in requirements("requirements-dev.txt")


@pytest.mark.parametrize("name", sorted(pins()))
def test_this_environment_has_the_pinned_versions(name):
    installed = Version(re.sub(r"\+.*", "", version(name)))  # torch's local label (+cpu) aside
    assert installed == pins()[name], f"{name} {installed} installed, {pins()[name]} pinned: run make setup"
