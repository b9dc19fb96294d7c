#!/usr/bin/env bash
# The CPU drafter campaign: fine-tune the shipped EAGLE-2 and Gumiho drafters on the target's own replies, a round
# at a time, on any CPU, in the background. docs/training.md#the-cpu-campaign.
#
#   nohup bash scripts/cpu_campaign.sh > runs/campaign/log.txt 2>&1 &     # start, or resume after a stop
#   ROUNDS=3 CONVERSATIONS=4096 bash scripts/cpu_campaign.sh               # settings come from the environment
#
# Each round: (1) extend the self-distilled data (ShareGPT prompts only, never the benchmark sets: later turns and
# long prompts with documents up to MAX_PROMPT_LEN tokens; shards resume, manifest with sha256); (2) fine-tune both
# drafters from the best so far, on the same data for the same steps, checkpointing every few minutes (a stopped
# run resumes from its last checkpoint); (3) held-out chain accuracy and tau on MT-Bench's first 20 at the 12-token
# tree, the new drafter and the best so far in the same run; (4) a drafter that beats the best on both (a higher tau
# and a held-out depth-1 accuracy at least as high) is shipped to assets/drafters (fp16, model card with the
# cumulative tokens seen and its evaluation, acceptance statistics recalibrated); the next round starts from it.
# FEATURES=int4 trains on, and judges by, the int4 path's features and tau instead of fp32's. DISTILL=gumiho writes
# the replies through the engine's own decoding loop on that path (prepare --engine), TASKS=1 takes task-shaped
# prompts (python -m gumiho.train prompts) instead of whole ShareGPT conversations.
#
# It holds a lock (a second campaign says so and exits 2), runs under nice, and writes its process group to
# $RUNS/campaign.pid, which `python -m gumiho bench` stops while it measures and continues afterwards (on 2 cores
# a background job skews every timing). A step that fails stops the campaign with the last good checkpoint kept.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PY:-.venv/bin/python}
RUNS=${RUNS:-runs/campaign}
CACHE=${CACHE:-cache/train}
ROUNDS=${ROUNDS:-1}
CONVERSATIONS=${CONVERSATIONS:-2048}  # per round's data set; a larger value extends the same seeded choice
SKIP=${SKIP:-12288}                   # of the seeded order: the conversations the shipped drafters trained on
HELDOUT=${HELDOUT:-120}
TURNS=${TURNS:-3}                     # user turns answered per conversation (later turns see earlier replies)
MAX_PROMPT_LEN=${MAX_PROMPT_LEN:-1024}
NEW_TOKENS=${NEW_TOKENS:-256}
EPOCHS=${EPOCHS:-2}
LR=${LR:-2e-4}
UNROLL=${UNROLL:-2}                   # training-time test: draft steps trained per position
CE_WEIGHT=${CE_WEIGHT:-0.1}           # the soft cross-entropy's weight beside the feature loss (--ce-weight)
CHECKPOINT_MINUTES=${CHECKPOINT_MINUTES:-5}
THREADS=${THREADS:-2}
# The target path whose features the drafters train on and whose tau judges them: float32 (the replies' own
# forward), or int4, the path a CPU runs the default model on (the same replies, their features computed again
# through the engine's 4-bit forward: `python -m gumiho.train refeature`).
FEATURES=${FEATURES:-float32}
# Who writes the replies: empty, batches of float32 rows (features then recomputed for FEATURES); or a method
# (gumiho, ar, lookup ...) whose greedy decoding loop on the FEATURES path writes them one prompt at a time, exactly
# that path's AR replies, with no refeature step: on the 2-core Zen 4 EPYC the int4 path's Gumiho wrote 216 reply
# tokens/s against 98 for batches of 32 (docs/training.md#task-shaped-data).
DISTILL=${DISTILL:-}
# 1: one turn each of ShareGPT first turns that ask for the benchmark sets' kinds of task (code, arithmetic,
# summaries of a given text, short factual questions, short instructions; none sharing 8 words with a benchmark
# prompt), at most PER_TASK of each, instead of whole ShareGPT conversations.
TASKS=${TASKS:-0}
PER_TASK=${PER_TASK:-400}
# With TASKS=1: leave out the prompts of the smaller choice task$EXCLUDE_PER_TASK (the seeded choices nest), e.g. 400,
# the prompts the shipped drafters' round 7 trained on; data and runs then read task${PER_TASK}x$EXCLUDE_PER_TASK.
EXCLUDE_PER_TASK=${EXCLUDE_PER_TASK:-}
DRAFTERS=${DRAFTERS:-gumiho eagle2}  # the drafters each round fine-tunes, in this order
for drafter in $DRAFTERS; do
    if [ ! -d "assets/drafters/smollm2-135m-$drafter" ]; then
        echo "error: DRAFTERS names $drafter, which has no shipped drafter to start from (gumiho, eagle2)" >&2
        exit 2
    fi
done

mkdir -p "$RUNS"
exec 9>"$RUNS/campaign.lock"
if ! flock -n 9; then
    echo "error: another campaign holds $RUNS/campaign.lock" >&2
    exit 2
fi
echo "$(ps -o pgid= $$ | tr -d ' ')" > "$RUNS/campaign.pid"
trap 'rm -f "$RUNS/campaign.pid"' EXIT
renice -n 19 -p $$ > /dev/null

log() { echo "[campaign $(date -u +%FT%TZ)] $*"; }
steps_every=$(( CHECKPOINT_MINUTES * 60 / 5 ))  # about 5 s a step at 4,096 tokens on 2 fp32 cores
tau() { $PY -c "import json, sys; print(next(iter(json.load(open(sys.argv[1]))['tau'].values()))['tau_mean'])" "$1"; }
chain1() { $PY -c "import json, sys; print(json.load(open(sys.argv[1]))['chain_accuracy'][0])" "$1"; }

$PY -c "from gumiho.target import ensure_default_model; ensure_default_model()"
for round in $(seq 1 "$ROUNDS"); do
    name=campaign skip=$SKIP turns=$TURNS suffix=""
    prompts=(); heldout_prompts=()
    if [ "$TASKS" = 1 ]; then
        # PER_TASK names the prompt files and the data: another PER_TASK is another seeded choice, never mixed
        # into shards made from this one.
        name="task$PER_TASK" skip=0 turns=1 suffix="-tasks$PER_TASK" exclude=()
        for side in train heldout; do
            [ -s "$CACHE/$name-prompts-$side.jsonl" ] || $PY -m gumiho.train prompts --split "$side" \
                --per-task "$PER_TASK" --out "$CACHE/$name-prompts-$side.jsonl"
        done
        heldout_prompts=(--data "$CACHE/$name-prompts-heldout.jsonl" --max-prompt-len "$MAX_PROMPT_LEN")
        if [ -n "$EXCLUDE_PER_TASK" ]; then
            old="$CACHE/task$EXCLUDE_PER_TASK-prompts-train.jsonl"
            [ -s "$old" ] || $PY -m gumiho.train prompts --per-task "$EXCLUDE_PER_TASK" --out "$old"
            name="${name}x$EXCLUDE_PER_TASK" suffix="${suffix}x$EXCLUDE_PER_TASK"
            [ -s "$CACHE/$name-prompts-train.jsonl" ] || $PY -m gumiho.train prompts --per-task "$PER_TASK" \
                --exclude "$old" --out "$CACHE/$name-prompts-train.jsonl"
        fi
        prompts=(--data "$CACHE/$name-prompts-train.jsonl")
    fi
    data="$CACHE/$name-train" heldout="$CACHE/$name-heldout" writer=()
    if [ -n "$DISTILL" ]; then  # the FEATURES path writes the replies and their features at once
        data="$data-$DISTILL-$FEATURES" heldout="$heldout-$DISTILL-$FEATURES" suffix="$suffix-$DISTILL-$FEATURES"
        writer=(--engine "$DISTILL" --dtype "$FEATURES")
    fi
    log "round $round: data ($CONVERSATIONS conversations, $turns turns, prompts up to $MAX_PROMPT_LEN tokens)"
    $PY -m gumiho.train prepare --split heldout "${heldout_prompts[@]}" --conversations "$HELDOUT" \
        --max-new-tokens "$NEW_TOKENS" --shard-size 64 --gen-batch 32 --threads "$THREADS" "${writer[@]}" \
        --out "$heldout"
    $PY -m gumiho.train prepare --split train "${prompts[@]}" --skip "$skip" --conversations "$CONVERSATIONS" \
        --turns "$turns" --max-prompt-len "$MAX_PROMPT_LEN" --max-new-tokens "$NEW_TOKENS" --shard-size 64 \
        --gen-batch 32 --threads "$THREADS" "${writer[@]}" --out "$data"
    if [ -z "$DISTILL" ] && [ "$FEATURES" != float32 ]; then
        for folder in "$data" "$heldout"; do
            $PY -m gumiho.train refeature --data "$folder" --out "$folder-$FEATURES" --dtype "$FEATURES" \
                --threads "$THREADS"
        done
        data="$data-$FEATURES" heldout="$heldout-$FEATURES" suffix="$suffix-$FEATURES"
    fi
    for drafter in $DRAFTERS; do
        shipped="assets/drafters/smollm2-135m-$drafter"
        # A run belongs to the drafter it starts from and to its data: after a drafter is shipped (here or by a GPU
        # round), or with a larger CONVERSATIONS, a restarted campaign begins new runs instead of resuming, or
        # re-judging, runs of other settings (whose checkpoints the trainer would refuse).
        run="$RUNS/round-$round-$drafter-$(sha256sum "$shipped/model.safetensors" | cut -c1-8)-c$CONVERSATIONS$suffix"
        log "round $round: fine-tune $drafter from $shipped -> $run"
        $PY -m gumiho.train --drafter "$drafter" --init "$shipped" --data "$data" --out "$run" \
            --epochs "$EPOCHS" --lr "$LR" --warmup-steps 20 --batch-tokens 4096 --unroll "$UNROLL" --ce-weight "$CE_WEIGHT" \
            --seed "$round" --checkpoint-every "$steps_every" --threads "$THREADS" --dtype float32
        for which in new shipped; do
            folder=$([ "$which" = new ] && echo "$run/drafter" || echo "$shipped")
            [ -s "$run/eval-$which.json" ] || $PY -m gumiho.train eval --drafter-dir "$folder" \
                --heldout "$heldout" --prompts data/benchmarks/mt_bench.jsonl --limit 20 \
                --threads "$THREADS" --dtype "$FEATURES" --out "$run/eval-$which.json"
        done
        new=$(tau "$run/eval-new.json"); old=$(tau "$run/eval-shipped.json")
        new1=$(chain1 "$run/eval-new.json"); old1=$(chain1 "$run/eval-shipped.json")
        log "round $round: $drafter tau on MT-Bench 20: new $new, shipped $old;" \
            "held-out depth-1 accuracy: new $new1, shipped $old1"
        # Shipped only when it beats the shipped drafter on both: tau on 20 prompts alone moves by noise.
        if $PY -c "import sys; t, t0, a, a0 = map(float, sys.argv[1:]); sys.exit(0 if t > t0 and a >= a0 else 1)" \
                "$new" "$old" "$new1" "$old1"; then
            $PY -m gumiho.train ship --run "$run" --dest "$shipped" --eval "$run/eval-new.json"
            $PY -m gumiho calibrate --method "$drafter" --prompts data/calibration/prompts.jsonl --threads "$THREADS"
            # and each method that drafts with these weights (EAGLE-1 with EAGLE-2's), whose statistics were the old
            # weights'
            for borrowed in "$shipped"/acceptance-*.json; do
                [ -e "$borrowed" ] || continue
                borrowed=$(basename "$borrowed" .json)
                $PY -m gumiho calibrate --method "${borrowed#acceptance-}" --prompts data/calibration/prompts.jsonl \
                    --threads "$THREADS"
            done
            log "round $round: shipped the new $drafter drafter"
        fi
    done
done
log "done"
