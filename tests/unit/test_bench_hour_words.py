"""``bench.hour_words``: the words on the frames an hour's answers read, each drawn thing classed by them."""

from __future__ import annotations

import json

from bench.hour import main as hour_main
from bench.hour_words import main
from videokv_node.tinyvlm.train_things_head import word_class


def test_a_drawn_thing_is_classed_by_the_words_on_its_frame():
    assert word_class("green circle", ["red circle", "cat"]) == "miscoloured"
    assert word_class("green circle", ["green square"]) == "misshaped"
    assert word_class("green circle", ["green circle", "red circle"]) == "named"
    assert word_class("green circle", ["orange", "green pepper"]) == "unnamed"  # a noun, not the head's word
    assert word_class("green circle", ["orange"]) == "unnamed" and word_class("green circle", []) == "unnamed"


def test_every_answer_of_a_row_is_read_frame_by_frame(tmp_path, capsys):
    details = tmp_path / "details.jsonl"
    assert hour_main(["--model", "videokv-tiny-random", "--frames", "100", "--streams", "1", "--policies", "",
                      "--without", "shipped,full,recency,default", "--out", str(tmp_path / "hour.md"),
                      "--details", str(details), "--footage", ""]) == 0
    asked = [json.loads(line) for line in details.read_text().splitlines() if '"question"' in line]
    capsys.readouterr()
    assert main([str(details), "--model", "videokv-tiny-random", "--all", "--footage", ""]) == 0
    out = capsys.readouterr().out
    blocks = out.strip().split("\n\n")
    assert len([b for b in blocks if b.startswith("hour100-0 | ")]) == len(asked) > 0
    for d, block in zip(asked, [b for b in blocks if b.startswith("hour100-0 | ")]):
        rows = block.splitlines()[1:]
        assert len(rows) == sum(b - a + 1 for a, b in d["context"])  # one line per frame read
        starred = {int(r[4:9]) for r in rows if r.startswith("  *")}
        assert starred == {f for g in d["needles"] for f in g}  # the needles' frames marked
    assert f"{len(asked)} answers of 'ceiling'" in out


def test_a_details_file_without_contexts_is_refused(tmp_path):
    old = tmp_path / "old.jsonl"
    old.write_text(json.dumps({"frames": 100, "row": "ceiling (things + 4 other frames)", "stream": "hour100-0",
                               "question": "q", "kind": "colour", "chosen": 0, "answer": 1, "found": True}) + "\n")
    try:
        main([str(old), "--model", "videokv-tiny-random", "--footage", ""])
    except SystemExit as e:
        assert "context" in str(e)
    else:
        raise AssertionError("an old details file was read")
