"""``scripts/train_videokv_tiny.sh`` (``make train-model``) makes v6.3 as it was made: each stage's schedule is the
one its run recorded (records/videokv-tiny/v6-runN/progress.json), from the run before it, to the step it reached.

Read from the script's text and parsed by train_v6's own parser, so a stage whose arguments drift from the record,
or that train_v6 would refuse, fails here rather than hours into a training run.
"""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest

from videokv_node.tinyvlm.train_v6 import _parser

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "train_videokv_tiny.sh"
RECORDS = REPO / "records" / "videokv-tiny"
SCHEDULE = ("seed", "steps", "batch", "lr", "lora_lr", "min_frames", "max_frames", "v5_share", "hour_kind_weights",
            "v5_kind_weights", "max_gap", "gap_share", "hour_examples", "letter_share", "head_frames", "lora_targets",
            "touching_share", "glimpse_share")
RUNS = ["v6-run1", "v6-run2", "v6-run3", "v6-run4", "v6-run6", "v6-run7", "v6-run8", "v6-run9", "v6-run10"]
FROM = ["", "v6-run1", "v6-run2", "v6-run3", "v6-run4", "v6-run6", "v6-run7", "v6-run8", "v6-run9"]  # run5 was a side branch


def stages() -> dict[str, tuple[str, int, list[str]]]:
    text = SCRIPT.read_text().replace("\\\n", " ")
    found = {}
    for line in text.splitlines():
        if re.match(r"^stage v6-run\d+ ", line):
            name, source, last, *args = shlex.split(line)[1:]
            found[name] = (source, int(last), args)
    return found


def test_the_runs_are_staged_in_order():
    assert list(stages()) == RUNS
    assert [s for s, _, _ in stages().values()] == FROM
    for name, source in zip(RUNS, FROM):  # each run started from the weights its stage gives it
        recorded = json.loads((RECORDS / name / "progress.json").read_text())["args"]
        assert recorded.get("weights_from", "None") == (f"records/videokv-tiny/{source}" if source else "None"), name


@pytest.mark.parametrize("name", RUNS)
def test_each_stage_s_schedule_is_its_recorded_run_s(name):
    source, last, args = stages()[name]
    parsed = vars(_parser().parse_args(["--head", "h", "--checkpoint", "c", "--seed", "0", "--batch", "8", *args]))
    recorded = json.loads((RECORDS / name / "progress.json").read_text())
    assert last == recorded["step"]  # where the run ended: its last step, or where time stopped it
    assert (parsed["stop_at"] or parsed["steps"]) == recorded["step"]
    for key in SCHEDULE:
        want = recorded["args"].get(key, "0" if key.endswith("_share") else "")  # keys later runs added
        got = parsed[key]
        assert (float(got) == float(want)) if isinstance(got, (int, float)) else (got or "") == want, (name, key, got, want)


def test_the_finish_writes_the_committed_model_from_the_last_stage():
    """The weights directory comes from the last stage's checkpoint, and the committed manifest is that run's."""
    text = SCRIPT.read_text().replace("\\\n", " ")
    finish = shlex.split(next(line for line in text.splitlines() if "--finish" in line))
    assert finish[finish.index("--checkpoint") + 1] == f"$RUNS/{RUNS[-1]}"
    manifest = json.loads((REPO / "videokv_node" / "videokv_node" / "models" / "weights" / "videokv-tiny" /
                           "manifest.json").read_text())
    assert manifest["training"]["command"] == json.loads((RECORDS / RUNS[-1] / "progress.json").read_text())["command"]
