"""``python -m videokv_node.programs.evaluate BAG QUESTIONS.json --out DIR --via ros``: the evaluation, the node over DDS.

The evaluation CLI of ``python -m videokv_node.eval`` (``eval/cli.py``: the same arguments,
outputs and exit status) with one more target, ``--via ros`` (``programs/replay_target.py``):
the node started as its own process, the bag's messages republished to it. It lives
with the ROS adapter because the evaluation package never imports ROS; ``--via engine``
works here too, so both sides of a comparison run from one command.
"""

from __future__ import annotations

import argparse
import sys

from videokv_node.eval.bag_io import ImageBag
from videokv_node.eval.cli import ROS_PROG, TARGETS, main as eval_main
from videokv_node.eval.settings import EngineSettings
from videokv_node.programs.replay_target import RosTarget


def ros_target(args: argparse.Namespace, settings: EngineSettings, params: dict, bag: ImageBag) -> RosTarget:
    """``--via ros``: the node as a process on the bag's image topics (compressed ones as CompressedImage), the
    bag's odometry, tf and camera_info passed on (``ImageBag.relay``)."""
    compressed = {t for t, m in bag.available.items() if m.endswith("CompressedImage")}
    return RosTarget(settings, params, bag.topics, compressed & set(bag.topics), log_path=args.out / "node.log",
                     relay=bag.relay)


def main(argv: list[str] | None = None) -> int:
    """The evaluation command with ``--via ros`` available; the exit status."""
    return eval_main(argv, targets={**TARGETS, "ros": ros_target}, prog=ROS_PROG)


if __name__ == "__main__":
    sys.exit(main())
