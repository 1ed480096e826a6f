#!/usr/bin/env bash
# videokv-tiny v6.3 (issue 43), the committed default, seeded, as it was made: one command, resumable, in stages
# (docs/MODELS.md "v6.3"; each stage's command is also in records/videokv-tiny/v6-runN/progress.json):
#   head  the drawn-things head on the frozen encoder's cells (python -m videokv_node.tinyvlm.train_things_head),
#         into v6-run1/ as the committed runs keep it;
#   v6-run1..v6-run4, v6-run6..v6-run8  the decoder's LoRA and the projector (python -m videokv_node.tinyvlm.train_v6),
#         each from the last one's weights at its own rates and mixture (run5 was a side branch, not on the way); run1,
#         run2 and run7 ended early when they were made (by time; run7 stopped to start run8 from it), here at the same
#         steps (--stop-at 200 of 360, 80 of 220, 240 of 400) so their schedules are the same; run6 on widens the LoRA
#         to k_proj and o_proj; run8 lays showings back to back and glimpses photographs (--touching-share,
#         --glimpse-share);
#   v6-run9, v6-run10  run8 continued: colour weighed up (3x, then 4x), more showings back to back (--touching-share
#         0.7) and v5's position examples beside motion and digits; run10's contexts reach 32 frames (v6.3, issue 43);
#   finish  the weights directory (OUT, default models/weights/videokv-tiny) from v6-run10's checkpoint.
# A stage whose checkpoint reached its last step is skipped; each train_v6 call stops after LIMIT seconds with a
# checkpoint: run the command again to go on. On 2 CPU cores: about 9 minutes for the head, hours for the runs.
# v5's decoder and projector (where every run starts from) are records/videokv-tiny/v5.1-candidate's.
# Usage: scripts/train_videokv_tiny.sh CACHE_DIR RUN_ROOT LIMIT_S [OUT]
#   CACHE_DIR: the encoder features (~1.5 GB, not kept); RUN_ROOT: where the v6-runN/ go: records/videokv-tiny,
#   whose committed runs are complete, rewrites v6.3's weights from v6-run10 in a minute; an empty directory trains
#   everything again.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CACHE="${1:?cache dir}"; RUNS="${2:?run root}"; LIMIT="${3:?seconds}"; OUT="${4:-videokv_node/videokv_node/models/weights/videokv-tiny}"
V5=records/videokv-tiny/v5.1-candidate
cd "$ROOT"
# shellcheck disable=SC1091
. ./env.sh
HEAD="$RUNS/v6-run1"  # where the committed runs keep it (every run read the same head)
mkdir -p "$CACHE" "$HEAD"
if [[ ! -f "$HEAD/things.safetensors" ]]; then
    python -m videokv_node.tinyvlm.train_things_head --train-frames 6000 --eval-frames 600 --steps 2000 \
        --out "$HEAD" --feature-cache "$CACHE/drawn.pt"
fi

step_of() { python -c "import json,sys; print(json.load(open(sys.argv[1]))['step'])" "$1/progress.json" 2>/dev/null || echo 0; }

# stage NAME FROM LAST_STEP ARGS...: train NAME from FROM's weights ('' for v5's) up to LAST_STEP, unless done.
stage() {
    local name="$1" from="$2" last="$3"; shift 3
    local dir="$RUNS/$name"
    mkdir -p "$dir"
    if (( $(step_of "$dir") >= last )); then return 0; fi
    python -m videokv_node.tinyvlm.train_v6 --seed 0 --init-from "$V5" --head "$HEAD" \
        --feature-cache "$CACHE/drawn.pt" --checkpoint "$dir" ${from:+--weights-from "$RUNS/$from"} \
        --batch 8 --threads 2 --time-limit "$LIMIT" "$@"
    if (( $(step_of "$dir") < last )); then
        echo "[train] $name checkpointed at step $(step_of "$dir") of $last; run again to continue (make train-model)"
        exit 0
    fi
}

stage v6-run1 "" 200 --steps 360 --stop-at 200 --lr 2e-4 --lora-lr 3e-4 --min-frames 8 --max-frames 40 --v5-share 0.35
stage v6-run2 v6-run1 80 --steps 220 --stop-at 80 --lr 1e-4 --lora-lr 1e-3 --min-frames 8 --max-frames 32 --v5-share 0.25
stage v6-run3 v6-run2 600 --steps 600 --lr 1e-4 --lora-lr 1e-3 --hour-kind-weights "hour colour=3,hour shape=3" \
    --min-frames 8 --max-frames 24 --v5-share 0.35
stage v6-run4 v6-run3 300 --steps 300 --lr 1e-4 --lora-lr 5e-4 --hour-kind-weights "hour colour=3,hour shape=3" \
    --min-frames 8 --max-frames 24 --v5-share 0.45 --v5-kind-weights "motion=6,digit=4"
stage v6-run6 v6-run4 300 --steps 300 --lr 1e-4 --lora-lr 5e-4 --lora-targets k_proj,o_proj \
    --hour-kind-weights "hour colour=2,hour order=3,hour count=2" --min-frames 8 --max-frames 24 --v5-share 0.45 \
    --v5-kind-weights "motion=6,digit=4"
stage v6-run7 v6-run6 240 --steps 400 --stop-at 240 --lr 1e-4 --lora-lr 5e-4 --lora-targets k_proj,o_proj \
    --hour-kind-weights "hour colour=3,hour order=3,hour count=2" --min-frames 8 --max-frames 24 --v5-share 0.45 \
    --v5-kind-weights "motion=6,digit=4"
stage v6-run8 v6-run7 300 --steps 300 --lr 1e-4 --lora-lr 5e-4 --lora-targets k_proj,o_proj \
    --hour-kind-weights "hour colour=3,hour order=3,hour count=2" --touching-share 0.6 --glimpse-share 0.5 \
    --min-frames 8 --max-frames 24 --v5-share 0.45 --v5-kind-weights "motion=6,digit=4"
stage v6-run9 v6-run8 300 --steps 300 --lr 1e-4 --lora-lr 5e-4 --lora-targets k_proj,o_proj \
    --hour-kind-weights "hour colour=3,hour shape=2,hour order=3,hour count=2" --touching-share 0.7 \
    --glimpse-share 0.5 --min-frames 8 --max-frames 24 --v5-share 0.45 --v5-kind-weights "motion=6,digit=6,position=4"
stage v6-run10 v6-run9 300 --steps 300 --lr 1e-4 --lora-lr 5e-4 --lora-targets k_proj,o_proj \
    --hour-kind-weights "hour colour=4,hour shape=2,hour order=3,hour count=2" --touching-share 0.7 \
    --glimpse-share 0.5 --min-frames 8 --max-frames 32 --v5-share 0.45 --v5-kind-weights "motion=6,digit=6,position=4"
python -m videokv_node.tinyvlm.train_v6 --seed 0 --init-from "$V5" --head "$HEAD" --checkpoint "$RUNS/v6-run10" \
    --lora-targets k_proj,o_proj --steps 300 --finish --out "$OUT"
echo "[train] videokv-tiny v6.3 written to $OUT"
