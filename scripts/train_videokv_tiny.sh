#!/usr/bin/env bash
# videokv-tiny v6 (issue 43), seeded, in three resumable steps (docs/MODELS.md, "v6"):
#   1. the drawn-things head on the frozen encoder's cells (python -m videokv_node.tinyvlm.train_things_head),
#      skipped where RUN already holds its weights (things.safetensors, things-head.json);
#   2. the decoder's LoRA and the projector (python -m videokv_node.tinyvlm.train_v6), continued from RUN's
#      checkpoint, at most LIMIT seconds (run it again to go on; the step count is the run's, 360);
#   3. once every step has run, the weights directory (models/weights/videokv-tiny) from the checkpoint (--finish).
# Usage: scripts/train_videokv_tiny.sh CACHE_DIR RUN_DIR LIMIT_S   (CACHE_DIR: the encoder features, ~1.5 GB, not kept)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CACHE="${1:?cache dir}"; RUN="${2:?run dir}"; LIMIT="${3:?seconds}"
STEPS=360
cd "$ROOT"
# shellcheck disable=SC1091
. ./env.sh
mkdir -p "$CACHE" "$RUN"
if [[ ! -f "$RUN/things.safetensors" ]]; then
    python -m videokv_node.tinyvlm.train_things_head --train-frames 6000 --eval-frames 600 --steps 2000 \
        --out "$RUN" --feature-cache "$CACHE/drawn.pt"
fi
python -m videokv_node.tinyvlm.train_v6 --head "$RUN" --feature-cache "$CACHE/drawn.pt" --checkpoint "$RUN" \
    --steps "$STEPS" --batch 8 --time-limit "$LIMIT"
if python -c "import json,sys; sys.exit(json.load(open('$RUN/progress.json'))['step'] < $STEPS)"; then
    python -m videokv_node.tinyvlm.train_v6 --head "$RUN" --checkpoint "$RUN" --steps "$STEPS" --finish
else
    echo "[train] checkpointed in $RUN; run again to continue (make train-model)"
fi
