"""Make evaluation inputs: a video file -> a rosbag2 of images, StreamingBench questions -> our schema,
and a synthetic bag with its questions (for tests and demos).

    python -m videokv_node.eval.make_bag VIDEO --out BAG [--fps 2] [--topic /camera/image_raw]
        [--storage mcap|sqlite3] [--compressed jpeg|png] [--max-side 448] [--max-frames N]
    python -m videokv_node.eval.make_bag --streamingbench questions_real.json --out QUESTIONS.json
    python -m videokv_node.eval.make_bag --synthetic --out BAG [--frames 40] [--fps 2] [--questions Q.json]
    python -m videokv_node.eval.make_bag --robot --out BAG [--questions Q.json] [--seconds S] [--fps 1] [--size 160 120]
        (a robot's bag: real footage, camera_info, odometry and tf, with questions; eval/robot_bag.py; make bag)

A bag's header stamps equal its bag times, starting at ``--start`` seconds (not 0:
a zero stamp means "unstamped" to the node), so a question's ``end_time`` t is
asked once the frames recorded in the first t seconds are in memory.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from videokv_node.eval.bag_io import write_image_bag
from videokv_node.eval.questions import QuestionFileError, parse_questions
from videokv_node.ingest.sampler import NS_PER_S
from videokv_node.synthetic import COLOURS, SyntheticScene

DEFAULT_TOPIC = "/camera/image_raw"
_CLOCK = re.compile(r"^\s*(?:(\d+):)?(\d{1,2}):(\d{1,2}(?:\.\d+)?)\s*$")


# --- videos ------------------------------------------------------------------
def video_frames(path: str | Path, fps: float, max_side: int = 0, max_frames: int = 0,
                 start_ns: int = NS_PER_S) -> Iterator[tuple[int, np.ndarray]]:
    """(stamp_ns, RGB) frames of a video sampled at ``fps`` (0: every frame), stamped by video time.

    Frame k of the file is at k / (the file's fps) seconds; a frame is kept when its time is at
    least 1 / ``fps`` after the last kept one (the node's sampling rule, on video time). The file
    is opened here, so an unreadable video raises ValueError before anything is written.
    """
    import cv2

    cap = cv2.VideoCapture(str(path))
    if not cap.isOpened():
        raise ValueError(f"{path}: OpenCV cannot open this video")
    src_fps = cap.get(cv2.CAP_PROP_FPS)
    if not src_fps or not np.isfinite(src_fps) or src_fps <= 0:
        cap.release()
        raise ValueError(f"{path}: the video reports no frame rate")
    return _read(cap, cv2, src_fps, round(NS_PER_S / fps) if fps > 0 else 0, max_side, max_frames, start_ns, path)


def _read(cap, cv2, src_fps, period_ns, max_side, max_frames, start_ns, path):
    next_ns, kept, k = 0, 0, 0
    try:
        while max_frames <= 0 or kept < max_frames:
            ok, bgr = cap.read()
            if not ok:
                break
            t_ns = round(k * NS_PER_S / src_fps)
            k += 1
            if t_ns < next_ns:
                continue
            next_ns = t_ns + period_ns if period_ns else t_ns + 1
            rgb = cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB)
            scale = max_side / max(rgb.shape[:2]) if max_side > 0 else 1.0
            if scale < 1.0:
                size = (max(1, round(rgb.shape[1] * scale)), max(1, round(rgb.shape[0] * scale)))
                rgb = cv2.resize(rgb, size, interpolation=cv2.INTER_AREA)
            kept += 1
            yield start_ns + t_ns, np.ascontiguousarray(rgb)
    finally:
        cap.release()
    if kept == 0:
        raise ValueError(f"{path}: no frame could be decoded")


# --- StreamingBench ----------------------------------------------------------
def parse_clock(text: str) -> float:
    """"HH:MM:SS" or "MM:SS" (seconds may have decimals) -> seconds."""
    m = _CLOCK.match(str(text))
    if m is None:
        raise ValueError(f"time_stamp {text!r} is not HH:MM:SS or MM:SS")
    h, mnt, s = m.groups()
    return int(h or 0) * 3600 + int(mnt) * 60 + float(s)


def convert_streamingbench(data) -> list[dict]:
    """StreamingBench's question files -> the ReKV/StreamKV schema (validated).

    StreamingBench: a list of ``{video_path, questions: [{task_type, time_stamp "HH:MM:SS",
    question, options ["A. ...", ...], answer "C"}]}``; the video_id is the video file's stem,
    entries of the same video are merged, and the task type becomes ``question_type``.
    """
    if not isinstance(data, list):
        raise QuestionFileError(f"a StreamingBench file is a JSON list of videos, got {type(data).__name__}")
    videos: dict[str, list[dict]] = {}
    for i, entry in enumerate(data):
        where = f"entry [{i}]"
        if not isinstance(entry, dict) or not isinstance(entry.get("video_path"), str):
            raise QuestionFileError(f"{where}: expected an object with a 'video_path' string")
        qs = entry.get("questions")
        if not isinstance(qs, list):
            raise QuestionFileError(f"{where} ({entry['video_path']}): 'questions' must be a list")
        convs = videos.setdefault(Path(entry["video_path"]).stem, [])
        for j, q in enumerate(qs):
            if not isinstance(q, dict):
                raise QuestionFileError(f"{where}.questions[{j}]: expected an object")
            try:
                end = parse_clock(q.get("time_stamp", ""))
            except ValueError as exc:
                raise QuestionFileError(f"{where}.questions[{j}]: {exc}") from exc
            conv = {"question": q.get("question"), "answer": q.get("answer"), "end_time": end,
                    "question_type": q.get("task_type", "") or ""}
            if q.get("options"):
                conv["choices"] = q["options"]
            convs.append(conv)
    out = [{"video_id": vid, "conversations": convs} for vid, convs in videos.items()]
    parse_questions(out, "converted StreamingBench file")  # refuse now what an evaluation would refuse later
    return out


# --- synthetic ---------------------------------------------------------------
def synthetic_questions(scene: SyntheticScene, video_id: str) -> list[dict]:
    """Multiple-choice questions with known answers about the scene, asked after what they ask about.

    For each object: its colour, asked when it was last visible; for the digit: its value.
    The question types are "colour" and "digit". Times are stream seconds (from the first frame).
    """
    events = scene.events_summary()
    convs = []
    for ev in events:
        end = (ev.last_stamp_ns) / NS_PER_S
        if ev.shape == "digit":
            value = int(ev.name.split()[-1])
            choices = sorted(str((value + k) % 10) for k in range(4))
            convs.append({"question": "Which digit was shown?", "choices": choices, "answer": choices.index(str(value)),
                          "end_time": end, "question_type": "digit"})
            continue
        # Another object of the same shape must not make a wrong choice right: its colour is left out.
        taken = {e.colour for e in events if e.shape == ev.shape and e.name != ev.name}
        others = [c for c in sorted(COLOURS) if c != ev.colour and c not in taken][:3]
        choices = sorted([ev.colour, *others])
        span = f"{ev.first_stamp_ns / NS_PER_S:.1f} s to {ev.last_stamp_ns / NS_PER_S:.1f} s"
        convs.append({"question": f"What colour was the {ev.shape} seen from {span}?", "choices": choices,
                      "answer": choices.index(ev.colour), "end_time": end, "question_type": "colour"})
    for c in convs:  # 0-based answer indices -> letters, the schema's form
        c["answer"] = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"[c["answer"]]
    return [{"video_id": video_id, "duration": len(scene) / scene.fps, "conversations": convs}]


def make_synthetic_bag(out: str | Path, frames: int = 40, fps: float = 2.0, width: int = 64, height: int = 48,
                       seed: int = 0, topic: str = DEFAULT_TOPIC, storage: str = "mcap", compressed: str = "",
                       start_ns: int = NS_PER_S) -> tuple[int, list[dict]]:
    """Write the default synthetic scenario as a bag; returns (frames written, its questions in our schema)."""
    from videokv_node.synthetic import default_scenario

    scene = SyntheticScene(width, height, fps, seed, default_scenario(frames))
    n = write_image_bag(out, ((s, rgb) for s, rgb, _ in scene.frames(start_stamp_ns=start_ns)), topic, storage, compressed)
    return n, synthetic_questions(scene, Path(out).name)


# --- command line ------------------------------------------------------------
def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m videokv_node.eval.make_bag", description=__doc__.split("\n\n")[0])
    p.add_argument("video", nargs="?", type=Path, help="a video file OpenCV can read")
    p.add_argument("--out", type=Path, required=True, help="the bag directory (or question file) to write")
    p.add_argument("--streamingbench", type=Path, help="convert this StreamingBench question file instead")
    p.add_argument("--synthetic", action="store_true", help="write the synthetic scenario instead of a video")
    p.add_argument("--robot", action="store_true",
                   help="write the robot bag (real footage, camera_info, odometry, tf; eval/robot_bag.py) instead")
    p.add_argument("--questions", type=Path, help="--synthetic, --robot: also write its questions here")
    p.add_argument("--frames", type=int, default=40, help="--synthetic: frames in the scenario (>= 20)")
    p.add_argument("--size", type=int, nargs=2, metavar=("W", "H"), help="--synthetic (64 48), --robot (160 120): frame size")
    p.add_argument("--seed", type=int, default=0, help="--synthetic: background texture seed")
    p.add_argument("--seconds", type=float, help="--robot: only the first this many seconds of the drive (default: all, 120)")
    p.add_argument("--fps", type=float, help="frames per second written (default 2; --robot: the camera's rate, 1; "
                                             "video: 0 = every frame)")
    p.add_argument("--topic", default=DEFAULT_TOPIC)
    p.add_argument("--storage", choices=("mcap", "sqlite3"), default="mcap")
    p.add_argument("--compressed", choices=("jpeg", "png"), help="write sensor_msgs/CompressedImage")
    p.add_argument("--max-side", type=int, default=0, help="video: downscale so the longer side is at most this (0: keep)")
    p.add_argument("--max-frames", type=int, default=0, help="video: stop after this many frames (0: all)")
    p.add_argument("--start", type=float, default=1.0, help="header stamp (s) of the first frame; 0 means unstamped to ROS")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    start_ns = round(args.start * NS_PER_S)
    fps = args.fps if args.fps is not None else (1.0 if args.robot else 2.0)
    try:
        if args.streamingbench:
            converted = convert_streamingbench(json.loads(args.streamingbench.read_text(encoding="utf-8")))
            args.out.write_text(json.dumps(converted, indent=1) + "\n")
            print(f"{sum(len(v['conversations']) for v in converted)} questions of {len(converted)} videos -> {args.out}")
        elif args.robot:
            from videokv_node.eval.robot_bag import write_robot_bag

            n, questions = write_robot_bag(args.out, *(args.size or (160, 120)), camera_hz=fps, seconds=args.seconds,
                                           storage=args.storage)
            if args.questions:
                args.questions.write_text(json.dumps(questions, indent=1) + "\n")
            print(f"{n} messages -> {args.out}" + (f", questions -> {args.questions}" if args.questions else ""))
        elif args.synthetic:
            n, questions = make_synthetic_bag(args.out, args.frames, fps, *(args.size or (64, 48)), seed=args.seed, topic=args.topic,
                                              storage=args.storage, compressed=args.compressed or "", start_ns=start_ns)
            if args.questions:
                args.questions.write_text(json.dumps(questions, indent=1) + "\n")
            print(f"{n} frames -> {args.out}" + (f", questions -> {args.questions}" if args.questions else ""))
        elif args.video:
            frames = video_frames(args.video, fps, args.max_side, args.max_frames, start_ns)
            n = write_image_bag(args.out, frames, args.topic, args.storage, args.compressed or "")
            print(f"{n} frames of {args.video} -> {args.out} ({args.topic})")
        else:
            print("error: give a VIDEO, --streamingbench FILE, --synthetic or --robot", file=sys.stderr)
            return 2
    except (OSError, ValueError) as exc:  # QuestionFileError and json errors are ValueErrors
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
