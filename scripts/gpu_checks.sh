#!/usr/bin/env bash
# The checks that need a CUDA device, in one short run (docs/TESTING.md, "On a GPU"): the GPU
# tests, the engine's ingest and TTFT at LLaVA-OneVision-0.5B and -7B geometry (bench/gpu_geometry.py),
# one needle stream through the engine on the CPU and on the GPU (the speed-up, and that the rows
# agree), and the vision-backend bench. Everything goes to $OUT (default ./gpu-checks): pytest.txt,
# geometry.md (+ .json), stream_cpu.md, stream_cuda.md, vision.md, log.txt.
#
# Each step has its own time limit (a lent machine gives 15 minutes, its start included): a step
# that runs past it is stopped and logged with rc=124, and the next one runs. A transformers wheel
# carried in .whl/ (the image's is older than the pin) goes first on PYTHONPATH, see docs/TESTING.md.
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

step() {  # step NAME SECONDS COMMAND...: run with a limit, log rc and seconds
    local name=$1 limit=$2 start=$(date +%s)
    shift 2
    timeout "$limit" "$@"
    echo "$name rc=$? in $(( $(date +%s) - start )) s" >>"$log"
}

step pytest 150 python3 -m pytest -q -rs -p no:cacheprovider tests/unit/test_clock.py tests/unit/test_host_arena.py \
    tests/unit/test_cuda_paths.py tests/unit/test_vision_tensorrt.py tests/unit/test_vision_tensorrt_calls.py \
    tests/unit/test_vision_engine_cache.py >"$OUT/pytest.txt" 2>&1

step geometry 170 python3 -m bench.gpu_geometry --geometries 0.5b,7b --device cuda --frames "${GEOMETRY_FRAMES:-240}" \
    --out "$OUT/geometry.md" 2>>"$log"

stream=(--model "${MODEL:-tiny-text}" --lengths "${FRAMES:-80}" --streams 1 --budgets 0.1 --seed 1 --out -)
for device in cpu cuda; do
    step "stream on $device" 60 python3 -m bench.long_stream "${stream[@]}" --device "$device" >"$OUT/stream_$device.md" 2>>"$log"
done

step vision 60 python3 -m bench.run --part vision --out "$OUT/vision.md" >>"$log" 2>&1
cat "$log"
