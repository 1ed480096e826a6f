"""Process-wide settings a program using the model applies once at start: torch's CPU threads and
the interpreter's GIL switch interval. One owner for both, so the node, the evaluation and the
Spava service apply them alike.

Why the node lowers the switch interval (issue 33, measured in docs/bench/load.md): the node's
model worker runs torch ops that release the GIL while they compute and take it back after, a
few hundred times per decoder pass. rclpy's executor thread, at a robot's camera rates (four
cameras at 15 Hz), spends most of its time in Python building wait sets and dispatching
callbacks, so it nearly always holds the GIL when the worker wants it back; CPython then makes
the worker wait a whole switch interval (5 ms by default) before it forces a hand-over. Each op
waiting 5 ms turned a 0.2 s frame into seconds: the queue overflowed, questions were refused,
and the node "collapsed" at about one core of CPU while the other core was idle (py-spy
``--gil``: the executor thread held the GIL 87% of the time). A 0.1 ms interval bounds that wait
at 0.1 ms; its cost is more frequent hand-overs between Python threads that all want the GIL,
which the load benchmark shows to be small against what it saves.
"""

from __future__ import annotations

import sys

import torch


def apply_process_settings(torch_threads: int = 0, gil_switch_interval_s: float | None = None) -> None:
    """``torch_threads`` > 0 sets torch's intra-op CPU threads (0 leaves torch's default, all cores);
    ``gil_switch_interval_s`` (seconds, > 0) sets ``sys.setswitchinterval`` (None leaves Python's 5 ms)."""
    if torch_threads > 0:
        torch.set_num_threads(torch_threads)
    if gil_switch_interval_s is not None:
        sys.setswitchinterval(gil_switch_interval_s)
