"""bench.locate_things: each query is ranked every way on the same memory and tallied against its truth.

A fake engine answers by the generation config it is given, so the tally and the table are what is checked.
"""

from __future__ import annotations


from bench import locate_things as lt
from bench.machine import Machine
from videokv_node.memory.questions.locate import LocateResult, Moment

MACHINE = Machine(cpu="Test CPU", cores=2, ram_gib=24.0, gpu="no GPU", torch="2.x", torch_threads=1, transformers="5.x",
                  python="3.11", commit="abc1234", date="2026-11-26T00:00:00+00:00", load_start=(0.1, 0.1, 0.1))


class FakeEngine:
    """Top moment 1 s by the first ranking, 2 s re-ranked under the default prompt, 3 s under any other."""

    def __init__(self):
        self.generation, self.asked = None, []

    def locate(self, query):
        answer = self.generation.answer
        self.asked.append((query.text, query.top_k, answer.locate_rerank, answer.locate_prompt))
        stamp = 1 if answer.locate_rerank == 0 else 2 if answer.locate_prompt == lt.PROMPTS[0] else 3
        return LocateResult([Moment(stamp, "camera", 0.0)], "x", 0.5)


def test_each_query_is_ranked_every_way_and_counted_against_its_truth():
    engine, case = FakeEngine(), lt.Case("c")
    lt.ask(engine, case, "the red circle", lambda s: s == 2)
    lt.ask(engine, case, "Where did you last see the red ball?", lambda s: s in (1, 2))
    assert case.queries == 2
    names = list(case.right)
    assert names == ["first ranking", f"re-ranked, {lt.PROMPTS[0]!r}", f"re-ranked, {lt.PROMPTS[1]!r}"]
    assert [case.right[n] for n in names] == [1, 2, 0]
    assert [a[2] for a in engine.asked[:3]] == [0, 8, 8] and all(a[1] == 1 for a in engine.asked)
    text = lt.render([case], dict(machine=MACHINE, command="cmd", niceness=0, wall_s=1.0, load_end=(1, 1, 1)))
    assert "| c | 2 | 1/2 | 2/2 | 0/2 | 500 | 500 | 500 |" in text
