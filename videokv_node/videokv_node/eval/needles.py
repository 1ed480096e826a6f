"""Text streams with needles: facts stated once, early, among many distractor frames, asked about later.

    python -m videokv_node.eval.needles --out DIR --streams 4 --frames 20 --seed 0

writes ``DIR/needles-000.jsonl`` ... (one text stream each, ``{"stamp": s, "text": ...}`` per
line) and ``DIR/questions.json`` in the annotation schema of ReKV and StreamKV (a JSON list
of ``{video_id, duration, conversations: [{question, choices, answer, end_time, question_type}]}``),
for ``python -m videokv_node.eval --text-stream DIR/needles-000.jsonl DIR/questions.json``.

What a memory must do here: keep (or retrieve) the few frames that matter for a question it
has not seen yet, out of many that do not. Question types, each multiple-choice with 4 options:
- ``single_fact``: where an object was left or what was left in a place, stated in one frame;
- ``two_facts``: the room an object is in, which needs two frames (object -> container,
  container -> room), stated apart;
- ``order``: which of two sightings came first (or last), two frames apart in time.
Needles lie in the first ``needle_span`` of the stream; questions are asked at its end, so
every needle is at least half a stream old when asked. Distractors are generic robot log lines
that never mention a needle's object, container, room or animal, so a question has exactly
one answer in the stream. Everything comes from one ``random.Random(seed)``: the same seed
gives the same streams on every machine.
"""

from __future__ import annotations

import argparse
import json
import random
from dataclasses import dataclass
from pathlib import Path

OBJECTS = ("red key", "blue mug", "passport", "phone charger", "toolbox", "umbrella", "wallet", "laptop",
           "green scarf", "first aid kit", "flashlight", "water bottle")
PLACES = ("kitchen drawer", "garage shelf", "bedroom closet", "hallway table", "bathroom cabinet", "office desk",
          "laundry basket", "garden shed")
CONTAINERS = ("black backpack", "cardboard box", "wooden chest", "plastic crate", "leather bag", "metal tin")
ROOMS = ("attic", "basement", "living room", "porch", "cellar", "nursery", "sunroom", "pantry")  # none inside a PLACE
ANIMALS = ("cat", "dog", "parrot", "rabbit", "squirrel", "fox", "hedgehog", "goat")
# Distractor templates: none names an object, place, container, room or animal above.
DISTRACTORS = (
    "A person in a {color} jacket walks along the corridor.",
    "The robot's battery is at {pct} percent.",
    "The ceiling lights flicker for a moment.",
    "Someone closes a door somewhere down the hall.",
    "The floor near the entrance looks {state}.",
    "A delivery van drives past the window.",
    "The temperature reads {deg} degrees.",
    "Two people talk quietly near the stairs.",
    "The robot pauses to recompute its path.",
    "Rain taps on the window glass.",
    "A phone rings twice and stops.",
    "The hallway is empty and quiet.",
    "A child laughs in the distance.",
    "The robot passes a {color} poster on the wall.",
    "The wifi signal is {state} here.",
    "Footsteps echo from the upper floor.",
)
COLORS = ("yellow", "grey", "white", "brown", "purple", "orange")
STATES = ("clean", "wet", "dusty", "weak", "strong", "busy")
N_CHOICES = 4
LETTERS = "ABCD"


@dataclass(frozen=True, slots=True)
class NeedleQuestion:
    question: str
    choices: tuple[str, ...]  # N_CHOICES options, the answer among them
    answer: int  # index of the right choice
    question_type: str  # single_fact, two_facts or order
    evidence_stamps: tuple[float, ...]  # stamps (s) of the frames the answer needs
    # What the question is about as a planner would ask ``~/locate`` for it ("the red key"), found in
    # the first of its evidence frames; empty where no one thing is (order questions). Not in the
    # annotation file (bench/grounding.py reads it from the stream).
    subject: str = ""


@dataclass(frozen=True, slots=True)
class NeedleStream:
    video_id: str
    frames: tuple[tuple[float, str], ...]  # (stamp s, text), stamps increasing
    questions: tuple[NeedleQuestion, ...]  # all asked at ``duration``

    @property
    def duration(self) -> float:
        return self.frames[-1][0]

    def annotation(self) -> dict:
        """The stream's entry of the annotation schema (answers as option letters)."""
        return {
            "video_id": self.video_id,
            "duration": self.duration,
            "conversations": [
                {
                    "question": q.question,
                    "choices": list(q.choices),
                    "answer": LETTERS[q.answer],
                    "end_time": self.duration,
                    "question_type": q.question_type,
                    "evidence_stamps": list(q.evidence_stamps),
                }
                for q in self.questions
            ],
        }


def _choices(rng: random.Random, answer: str, pool: tuple[str, ...], exclude: tuple[str, ...] = ()) -> tuple[tuple[str, ...], int]:
    others = rng.sample([p for p in pool if p != answer and p not in exclude], N_CHOICES - 1)
    choices = others + [answer]
    rng.shuffle(choices)
    return tuple(choices), choices.index(answer)


def _distractor(rng: random.Random) -> str:
    template = rng.choice(DISTRACTORS)
    return template.format(color=rng.choice(COLORS), pct=rng.randrange(20, 100), state=rng.choice(STATES), deg=rng.randrange(15, 30))


def make_stream(video_id: str, n_frames: int, rng: random.Random, period_s: float = 2.0, needle_span: float = 0.5) -> NeedleStream:
    """One stream of ``n_frames`` frames every ``period_s`` s with 6 needle frames in its first
    ``needle_span``, and 8 questions: 5 single_fact (each object's place and the place's object,
    the container's room), 1 two_facts, 2 order (which sighting came first, which last)."""
    n_needles = 6
    span = max(n_needles, int(n_frames * needle_span))
    if n_frames < n_needles + 1 or span > n_frames:
        raise ValueError(f"a needle stream needs at least {n_needles + 1} frames, got {n_frames}")
    objs = rng.sample(OBJECTS, 3)
    places = rng.sample(PLACES, 2)
    container, room = rng.choice(CONTAINERS), rng.choice(ROOMS)
    first, second = rng.sample(ANIMALS, 2)
    needles = [
        f"The {objs[0]} was left in the {places[0]}.",
        f"The {objs[1]} was left in the {places[1]}.",
        f"The {objs[2]} is inside the {container}.",
        f"The {container} is in the {room}.",
        f"The robot saw a {first} near the door.",
        f"The robot saw a {second} near the door.",
    ]
    # Slots in the needle span: the fact pairs keep their order (container before room, first before second).
    slots = sorted(rng.sample(range(span), n_needles))
    order = [0, 1, 2, 3, 4, 5]
    rng.shuffle(order)
    # Keep the pairs (2, 3) and (4, 5) in their stated order in time.
    for a, b in ((2, 3), (4, 5)):
        ia, ib = order.index(a), order.index(b)
        if ia > ib:
            order[ia], order[ib] = b, a
    where = {needle: slots[i] for i, needle in enumerate(order)}
    texts = [_distractor(rng) for _ in range(n_frames)]
    for needle, slot in where.items():
        texts[slot] = needles[needle]
    stamps = [round(period_s * (i + 1), 3) for i in range(n_frames)]
    at = {needle: stamps[slot] for needle, slot in where.items()}
    questions = []
    for i in (0, 1):
        choices, answer = _choices(rng, places[i], PLACES, exclude=(places[1 - i],))
        questions.append(NeedleQuestion(f"Where was the {objs[i]} left?", choices, answer, "single_fact", (at[i],), f"the {objs[i]}"))
        # The same fact asked the other way round: its object among objects never in the stream.
        choices, answer = _choices(rng, objs[i], OBJECTS, exclude=tuple(o for o in objs if o != objs[i]))
        questions.append(NeedleQuestion(f"What was left in the {places[i]}?", choices, answer, "single_fact", (at[i],), f"the {places[i]}"))
    choices, answer = _choices(rng, room, ROOMS)
    questions.append(NeedleQuestion(f"In which room is the {container}?", choices, answer, "single_fact", (at[3],), f"the {container}"))
    questions.append(NeedleQuestion(f"In which room is the {objs[2]}?", choices, answer, "two_facts", (at[2], at[3]), f"the {objs[2]}"))
    sightings = (at[4], at[5])
    for which, right, other in (("first", first, second), ("last", second, first)):
        choices, answer = _choices(rng, right, ANIMALS, exclude=(other,))
        choices = list(choices)
        # The other sighting is always an option, so the question is about order, not presence.
        choices[(answer + 1) % N_CHOICES] = other
        questions.append(NeedleQuestion(
            f"Which animal did the robot see {which} near the door?", tuple(choices), answer, "order", sightings
        ))
    return NeedleStream(video_id, tuple(zip(stamps, texts)), tuple(questions))


def make_streams(n_streams: int, n_frames: int, seed: int = 0, period_s: float = 2.0) -> list[NeedleStream]:
    """``n_streams`` streams named ``needles-000`` ..., all from one seeded generator."""
    rng = random.Random(seed)
    return [make_stream(f"needles-{i:03d}", n_frames, rng, period_s) for i in range(n_streams)]


def write_streams(streams: list[NeedleStream], out: Path) -> tuple[list[Path], Path]:
    """One ``<video_id>.jsonl`` per stream and one ``questions.json`` for all: (frame files, question file)."""
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for s in streams:
        path = out / f"{s.video_id}.jsonl"
        path.write_text("".join(json.dumps({"stamp": t, "text": x}) + "\n" for t, x in s.frames))
        paths.append(path)
    questions = out / "questions.json"
    questions.write_text(json.dumps([s.annotation() for s in streams], indent=1) + "\n")
    return paths, questions


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m videokv_node.eval.needles", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True, help="directory for the stream files and questions.json")
    parser.add_argument("--streams", type=int, default=4, help="number of streams (default 4)")
    parser.add_argument("--frames", type=int, default=20, help="frames per stream (default 20)")
    parser.add_argument("--period", type=float, default=2.0, help="seconds between frames (default 2)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.streams < 1:
        parser.error("--streams must be >= 1")
    try:
        streams = make_streams(args.streams, args.frames, args.seed, args.period)
    except ValueError as exc:
        parser.error(str(exc))
    paths, questions = write_streams(streams, args.out)
    print(f"wrote {len(paths)} streams of {args.frames} frames and {questions}")


if __name__ == "__main__":
    main()
