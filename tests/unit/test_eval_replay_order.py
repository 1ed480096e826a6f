"""The replay's ordering invariant, for any bag and question times (hypothesis, no model):
a question is asked after exactly the frames recorded up to its end_time (after the bag's
end: all of them), and every question is either answered or skipped with a reason."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from videokv_node.eval.bag_io import ImageBag, write_image_bag
from videokv_node.eval.questions import parse_questions
from videokv_node.eval.replay import AskRefused, MemoryState, ReplayCounts, Reply, replay
from videokv_node.eval.results import ResultWriter

NS = 1_000_000_000
START = 7 * NS


class RecordingTarget:
    """Records what the replay does; refuses questions whose text says so."""

    via = "record"

    def __init__(self) -> None:
        self.counts = ReplayCounts()
        self.offered: list[int] = []
        self.asked: list[tuple[float, int]] = []  # (end_time, frames offered before it)
        self.settled_before_ask = True
        self._settled = False

    def offer(self, image) -> None:
        self.counts.messages += 1
        self.offered.append(image.bag_time_ns)
        self._settled = False

    def settle(self) -> None:
        self._settled = True

    def ask(self, q) -> Reply:
        self.settled_before_ask &= self._settled
        if q.question.startswith("refuse"):
            raise AskRefused("asked to refuse")
        self.asked.append((q.end_time, len(self.offered)))
        return Reply("red", 0, [], 0.0, 0.0, "letter")

    def memory(self) -> MemoryState:
        return MemoryState(len(self.offered), 0, 0, 0, 0.0)

    def report(self, writer, origin_ns) -> dict:
        return {}


@settings(max_examples=30, deadline=None)
@given(
    gaps=st.lists(st.integers(1, 3 * NS), min_size=1, max_size=12),
    times=st.lists(st.tuples(st.integers(0, 40), st.booleans()), max_size=8),
)
def test_questions_follow_exactly_the_frames_before_them(tmp_path_factory, gaps, times):
    tmp = tmp_path_factory.mktemp("order")
    stamps = list(START + np.cumsum([0] + gaps[:-1]))
    write_image_bag(tmp / "bag", ((int(s), np.zeros((2, 2, 3), np.uint8)) for s in stamps), "/cam")
    ends = [t / 4 for t, _ in times]  # quarter seconds: some land exactly on frames, some after the bag
    convs = [{"question": ("refuse " if refuse else "ask ") + str(i), "choices": ["red", "blue"], "answer": "A",
              "end_time": end} for i, (end, (_, refuse)) in enumerate(zip(ends, times))]
    video = parse_questions([{"video_id": "bag", "conversations": convs}])[0]
    target = RecordingTarget()
    writer = ResultWriter(tmp / "out", {})
    with ImageBag(tmp / "bag") as bag:
        replay(bag, video, target, writer, progress=False)
    writer.close()

    assert target.offered == stamps  # every frame, once, in bag time order
    assert target.settled_before_ask
    last_s = (stamps[-1] - START) / NS
    for end, n_before in target.asked:
        assert n_before == sum((s - START) / NS <= end for s in stamps)
    # Every question is asked but the refused ones, those after the bag's last frame too (from the whole bag).
    assert [e for e, _ in target.asked] == sorted(e for e, (_, refuse) in zip(ends, times) if not refuse)
    assert len(writer.rows) + len(writer.skipped) == len(convs)
    assert len(writer.skipped) == sum(refuse for _, refuse in times)
    assert all(n == len(stamps) for e, n in target.asked if e > last_s)
