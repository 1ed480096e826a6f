"""What the model writes on the frames an hour's answers read: ``python -m bench.hour_words DETAILS``.

    python -m bench.hour --frames 1800 --streams 4 --budgets 0.02 --policies '' \\
        --without shipped,full,recency,default --details /tmp/ceiling.jsonl --out -
    python -m bench.hour_words /tmp/ceiling.jsonl                 # the ceiling's wrong answers, frame by frame
    python -m bench.hour_words /tmp/ceiling.jsonl --all --model DIR  # every answer, a candidate's weights

Reads a ``bench.hour --details`` file (each answer's ``needles`` and ``context``), rebuilds each stream as
``bench.hour`` built it (same footage split, same real things) and prints, per answer of one row, every frame the
answer read: its source, whether it shows a drawn thing and which, and the words the model's noun block writes there
(``frame_nouns``: the encoder's nouns and the drawn-things head's words). Each drawn thing a frame shows is classed by
those words: ``named`` (its name written), ``miscoloured`` (its shape with another colour), ``misshaped`` (its colour
with another shape) or ``unnamed``. The summary counts, over the answers shown, the needles' things by their best class
and the head's words for things a frame does not show (false words: a bow tie's "red triangle" beside a drawn one).

Why: a wrong answer is the head's when the needle's frames carry no word for the thing or a wrong one, and the
decoder's when the words are right (docs/notes/2026-11-29-issue43-v64-candidate.md: the test ceiling's misses were the
head's, read this way). Diagnostic only: it writes no page.
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from pathlib import Path

from bench.accuracy import load_model
from bench.hour_rows import real_things_arg
from videokv_node.eval.footage import FootageLibrary
from videokv_node.eval.hour_stream import make_hour_stream
from videokv_node.models.things_head import THING_NAMES
from videokv_node.tinyvlm.train_things_head import WORD_CLASSES, word_class


def drawn_at(stream) -> dict[int, list[str]]:
    """frame -> the names of the drawn things it shows."""
    shows: dict[int, list[str]] = {}
    for a in stream.appearances:
        for f in a.frames:
            shows.setdefault(f, []).append(stream.things[a.thing].name)
    return shows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("details", type=Path, help="a bench.hour --details file")
    p.add_argument("--model", default="videokv-tiny", help="as bench.hour's --model (the run's, to read its words)")
    p.add_argument("--row", default="ceiling", help="the row whose answers to read (a prefix of its label)")
    p.add_argument("--all", action="store_true", help="every answer, not only the wrong ones")
    p.add_argument("--footage", default="test", help="as bench.hour's --footage")
    p.add_argument("--real-things", default=None, help="as bench.hour's --real-things")
    args = p.parse_args(argv)

    lines = [json.loads(line) for line in args.details.read_text().splitlines() if line.strip()]
    answers = [d for d in lines if "question" in d and d["row"].startswith(args.row)
               and (args.all or d["chosen"] != d["answer"])]
    if any("context" not in d for d in answers):
        raise SystemExit(f"{args.details}: written before bench.hour --details recorded each answer's context")
    adapter = load_model(args.model)
    library = FootageLibrary.load(split=args.footage or None)
    real = real_things_arg(args.real_things)
    streams: dict[str, tuple] = {}
    written: dict[tuple[str, int], list[str]] = {}  # (stream, frame) -> its words: a frame is read by many answers
    needles: Counter[str] = Counter()
    false_words: Counter[str] = Counter()
    read = 0
    for d in answers:
        if d["stream"] not in streams:
            seed = int(d["stream"].rsplit("-", 1)[1])
            stream = make_hour_stream(d["stream"], int(d["frames"]), seed, library, real_things=real)
            streams[d["stream"]] = (stream, drawn_at(stream))
        stream, shows = streams[d["stream"]]
        frames = [f for a, b in d["context"] for f in range(a, b + 1)]
        asked = {f for g in d["needles"] for f in g}
        todo = [f for f in frames if (d["stream"], f) not in written]
        for f, nouns in zip(todo, adapter.frame_nouns([stream.frame(f) for f in todo]) if todo else []):
            written[d["stream"], f] = [w for w, _ in nouns]
        words = [written[d["stream"], f] for f in frames]
        print(f"\n{d['stream']} | {d['question']} | chose {d['chosen']}, right {d['answer']}")
        best: dict[str, str] = {}
        for f, w in zip(frames, words):
            things = shows.get(f, [])
            marks = [f"{n}: {word_class(n, w)}" for n in things]
            print(f"  {'*' if f in asked else ' '} {f:5d} {stream.shot_of(f).source:24s} {', '.join(w) or '-':40s} "
                  f"{'; '.join(marks)}")
            read += 1
            false_words.update(x for x in w if x in THING_NAMES and x not in things)
            for n in things:
                if f in asked:
                    c = word_class(n, w)
                    best[n] = min(best.get(n, c), c, key=WORD_CLASSES.index)
        needles.update(best.values())
    print(f"\n{len(answers)} answers of '{args.row}'{'' if args.all else ' (wrong ones)'}: the needles' things by their best"
          f" words {dict((c, needles[c]) for c in WORD_CLASSES)}; over the {read} frames read, the head's words for things a frame"
          f" does not show: {dict(false_words.most_common())}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
