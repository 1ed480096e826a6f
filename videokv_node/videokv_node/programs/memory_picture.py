"""``make picture``: the README's picture of the memory, from a real replay of the example bag through the node.

    python -m videokv_node.programs.memory_picture [--bag BAG] [--out docs/images/memory.png] [--model M] [--param k=v]

Without ``--bag`` it writes ``make bag``'s two minutes of robot (eval/robot_bag.py) into a temporary directory. The
node runs as its own process in its own DDS domain with ``pose_topic: /odom``; the bag's images, odometry and tf are
republished to it as ``ros2 bag play`` would (``programs/memory_capture.py``), and ``~/memory_markers`` and
``~/memory_sheet`` are recorded as a viewer gets them; the picture (``view/picture.py``) is what they show once the
memory settled. Exit status 1, with the reason, where the node did not draw anything.
"""

from __future__ import annotations

import argparse
import datetime
import sys
import tempfile
from pathlib import Path

from videokv_node.eval.settings import parse_param
from videokv_node.programs.memory_capture import capture_replay
from videokv_node.view.picture import render_picture

REPO = Path(__file__).resolve().parents[3]
DEFAULTS = {"model": "videokv-tiny", "torch_threads": 1, "pose_topic": "/odom", "pose_wait_s": 5.0, "max_new_tokens": 2,
            "markers.rate_hz": 5.0}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--bag", default="", help="a rosbag2 directory (default: make bag's, written to a temporary directory)")
    p.add_argument("--out", default=str(REPO / "docs" / "images" / "memory.png"))
    p.add_argument("--model", default=DEFAULTS["model"])
    p.add_argument("--param", action="append", default=[], type=parse_param, help="a node parameter name=value, repeatable")
    args = p.parse_args(argv)
    params = {**DEFAULTS, "model": args.model, **dict(args.param)}
    with tempfile.TemporaryDirectory(prefix="videokv-picture-") as tmp:
        bag = Path(args.bag) if args.bag else Path(tmp) / "robot"
        if not args.bag:
            from videokv_node.eval.robot_bag import write_robot_bag

            write_robot_bag(bag)
        cap = capture_replay(bag, params, log_path=Path(tmp) / "node.log")
    final = cap.final
    if not final:
        print(f"memory_picture: the node drew nothing ({len(cap.arrays)} marker arrays received); its log's end:\n"
              + cap.node_log[-3000:], file=sys.stderr)
        return 1
    title = (f"What the robot remembers: {cap.frames_in_memory} frames in memory after make bag's "
             f"{cap.frames_ingested} sampled frames (model {Path(str(params['model'])).name})")
    notes = (f"python -m videokv_node.programs.memory_picture (make picture), {datetime.date.today().isoformat()}: "
             "the bag replayed through the node over DDS; markers and sheet as a viewer received them")
    png = render_picture(final, cap.sheets[-1] if cap.sheets else None, title, notes)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(png)
    print(f"memory_picture: {out} ({len(png) // 1024} KiB; {len(final)} markers, "
          f"{'a sheet' if cap.sheets else 'no sheet'})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
