#!/usr/bin/env bash
# The checks that need a CUDA device, in one short run (docs/TESTING.md, "On a GPU"): the GPU
# tests, one needle stream through the engine on the CPU and on the GPU (the speed-up, and that
# the rows agree), and the vision-backend bench. Everything goes to $OUT (default ./gpu-checks):
# pytest.txt, stream_cpu.md, stream_cuda.md, vision.md, log.txt.
#
# Runs with whichever python3 holds torch (a lent machine's image, or .venv after `. ./env.sh`);
# nothing is downloaded. One process at a time on the GPU: the first try ran 26 processes side by
# side, which time-sliced the GPU and finished nothing (docs/BENCHMARKS.md).
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="${OUT:-$ROOT/gpu-checks}"
mkdir -p "$OUT"
cd "$ROOT"
export PYTHONPATH="$ROOT/videokv_node:$ROOT${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
log="$OUT/log.txt"
python3 -c "import torch; assert torch.cuda.is_available(), 'no CUDA device visible to torch'; print(torch.__version__, torch.cuda.get_device_name(0))" >"$log" 2>&1 \
    || { cat "$log"; exit 2; }

python3 -m pytest -q -rs -p no:cacheprovider tests/unit/test_clock.py tests/unit/test_host_arena.py \
    tests/unit/test_cuda_paths.py tests/unit/test_vision_tensorrt.py tests/unit/test_vision_tensorrt_calls.py \
    tests/unit/test_vision_engine_cache.py >"$OUT/pytest.txt" 2>&1
echo "pytest rc=$?" >>"$log"

stream=(--model "${MODEL:-tiny-text}" --lengths "${FRAMES:-80}" --streams 1 --budgets 0.1 --seed 1 --out -)
for device in cpu cuda; do
    start=$(date +%s)
    python3 -m bench.long_stream "${stream[@]}" --device "$device" >"$OUT/stream_$device.md" 2>>"$log"
    echo "stream on $device rc=$? in $(( $(date +%s) - start )) s" >>"$log"
done

python3 -m bench.run --part vision --out "$OUT/vision.md" >>"$log" 2>&1
echo "vision rc=$?" >>"$log"
cat "$log"
