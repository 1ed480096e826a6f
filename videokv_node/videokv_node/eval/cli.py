"""``python -m videokv_node.eval``: replay a bag (or a text stream) and score the answers.

    python -m videokv_node.eval BAG QUESTIONS.json --out DIR [--rate R]
        [--topics T ...] [--video-id ID] [--model tiny] [--policy rekv] [--budget-tokens N]
        [--sample-fps F] [--param memory.retrieve_frames=4 ...] [--option-scoring likelihood|letter|cloze]
    python -m videokv_node.programs.evaluate BAG QUESTIONS.json --out DIR --via ros ...   (programs/evaluate.py)
    python -m videokv_node.eval --text-stream FRAMES.jsonl QUESTIONS.json ...   (eval/text_stream.py)

The targets are ``TARGETS`` (``--via engine``); the ROS adapter's command runs this same
CLI with its ``--via ros`` target added, so this package never imports ROS.

Exit status: 0 when the run completed (skipped questions are listed in skipped.jsonl
and summary.json), 2 for unusable inputs (nothing run), 1 when the run failed part-way:
the rows written so far stay in results.csv and a summary of them is still written.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from videokv_node.eval.arguments import RUN_ERROR, USAGE_ERROR, memory_arguments, memory_parameters
from videokv_node.memory.config import DEFAULT_OPTION_SCORING, OPTION_SCORINGS

if TYPE_CHECKING:
    from videokv_node.eval.bag_io import ImageBag
    from videokv_node.eval.settings import EngineSettings
    from videokv_node.eval.target import BagTarget

# A bag target from (the command line, the engine settings, the node parameters, the open bag).
TargetFactory = Callable[[argparse.Namespace, "EngineSettings", dict, "ImageBag"], "BagTarget"]
PROG = "python -m videokv_node.eval"
EVAL_ONLY_SCORING = "cloze"  # eval/option_scoring.py: a scoring the node does not offer
ROS_PROG = "python -m videokv_node.programs.evaluate"  # the same command with the node over DDS (--via ros)


def engine_target(args: argparse.Namespace, settings: EngineSettings, params: dict, bag: ImageBag) -> BagTarget:
    """``--via engine``: the engine in-process (eval/replay.py)."""
    from videokv_node.eval.replay import EngineTarget

    return EngineTarget(settings, args.option_scoring)


TARGETS: dict[str, TargetFactory] = {"engine": engine_target}


def bag_parser(prog: str = PROG) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog,
                                description="Replay a rosbag2's camera topics into the memory and ask the questions at their times.")
    p.add_argument("bag", type=Path, help="rosbag2 directory (mcap or sqlite3)")
    p.add_argument("questions", type=Path, help="question file (ReKV/StreamKV schema)")
    p.add_argument("--out", type=Path, required=True, help="directory for results.csv, summary.json, plots, report.md")
    p.add_argument("--via", choices=("engine", "ros"), default="engine",
                   help="engine: in-process (fast); ros: the node as a process, over DDS")
    p.add_argument("--rate", type=float, default=0.0, help="real-time factor; 0 (default): as fast as possible")
    p.add_argument("--topics", nargs="+", help="image topics to replay (default: every image topic of the bag)")
    p.add_argument("--video-id", help="entry of the question file to use (default: the bag's name, or the only entry)")
    p.add_argument("--option-scoring", choices=(*OPTION_SCORINGS, EVAL_ONLY_SCORING),
                   help=f"multiple choice: {' or '.join(OPTION_SCORINGS)} as the node answers (sets answer.option_scoring; "
                        f"default: that parameter's value, {DEFAULT_OPTION_SCORING}; likelihood: each option's text as the "
                        f"answer, mean log-probability per token; letter: the option letters' logits), or "
                        f"{EVAL_ONLY_SCORING} (summed log-probability, --via engine only)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    memory_arguments(p)
    return p


def run_bag(args: argparse.Namespace, targets: Mapping[str, TargetFactory] = TARGETS) -> int:
    """Replay the bag into the ``--via`` target of ``targets`` and score the answers; the exit status."""
    from videokv_node.eval.bag_io import BagError, ImageBag
    from videokv_node.eval.questions import QuestionFileError, load_questions, select_video
    from videokv_node.eval.replay import replay
    from videokv_node.eval.results import ResultWriter
    from videokv_node.eval.settings import engine_settings
    from videokv_node.memory.config import ConfigError

    if args.via not in targets:  # the eval package never imports ROS: the node's side has its own command
        print(f"error: --via {args.via} runs the node over DDS: use {ROS_PROG} (the same arguments)", file=sys.stderr)
        return USAGE_ERROR
    if args.via == "ros" and args.option_scoring == EVAL_ONLY_SCORING:
        print("error: --option-scoring cloze needs --via engine (the node scores by likelihood or letter)", file=sys.stderr)
        return USAGE_ERROR
    try:
        params = memory_parameters(args)
        settings = engine_settings(params)
        videos = load_questions(args.questions)
        bag = ImageBag(args.bag, args.topics)
    except (ConfigError, ValueError, QuestionFileError, BagError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return USAGE_ERROR
    with bag:
        try:
            video = select_video(videos, args.video_id or bag.name)
            if args.video_id and video.video_id != args.video_id:
                raise QuestionFileError(f"no video_id {args.video_id!r} in {args.questions}")
        except QuestionFileError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return USAGE_ERROR
        config = {"bag": str(args.bag), "questions": str(args.questions), "video_id": video.video_id, "via": args.via,
                  "rate": args.rate, "topics": bag.topics,
                  "option_scoring": args.option_scoring or settings.generation.answer.option_scoring,
                  "parameters": params, "settings": settings}
        writer = ResultWriter(args.out, config)
        target, extra, code = None, {}, 0
        try:
            target = targets[args.via](args, settings, params, bag)
            extra = replay(bag, video, target, writer, rate=args.rate, progress=not args.no_progress)
        except KeyboardInterrupt:
            extra, code = {"run_error": "interrupted"}, RUN_ERROR
        except Exception as exc:  # noqa: BLE001 - whatever failed, the rows so far are summarised
            extra, code = {"run_error": f"{type(exc).__name__}: {exc}"}, RUN_ERROR
            print(f"error: the run failed part-way: {exc}", file=sys.stderr)
        finally:
            if target is not None:
                try:
                    target.close()
                except Exception as exc:  # noqa: BLE001
                    extra.setdefault("close_error", str(exc))
            summary = writer.finish(extra)
    acc = summary["accuracy"]
    print(f"{summary['questions_answered']} answered, {summary['questions_skipped']} skipped, accuracy "
          f"{'n/a' if acc is None else f'{acc:.3f}'}; results in {args.out}")
    if summary.get("bag_error"):
        print(f"warning: {summary['bag_error']}", file=sys.stderr)
    return code


def run_text_stream(argv: list[str]) -> int:
    """Hand ``--text-stream FRAMES QUESTIONS ...`` to eval/text_stream.py (the SmolLM2 path)."""
    try:
        # import_module, not ``from videokv_node.eval import``: the latter finds the attribute on
        # the package once imported, bypassing sys.modules (which the tests stand in for).
        text_stream = importlib.import_module("videokv_node.eval.text_stream")
    except ImportError as exc:
        print(f"error: --text-stream needs videokv_node/eval/text_stream.py, which cannot be imported: {exc}", file=sys.stderr)
        return USAGE_ERROR
    p = argparse.ArgumentParser(prog="python -m videokv_node.eval --text-stream",
                                description="Evaluate the memory on a stream of text frames.")
    p.add_argument("--text-stream", nargs=2, metavar=("FRAMES.jsonl", "QUESTIONS.json"), required=True)
    if hasattr(text_stream, "add_arguments"):
        text_stream.add_arguments(p)
    return int(text_stream.main(p.parse_args(argv)) or 0)


def main(argv: list[str] | None = None, targets: Mapping[str, TargetFactory] = TARGETS, prog: str = PROG) -> int:
    """The command: ``--text-stream`` goes to eval/text_stream.py, anything else is a bag replay into ``targets``."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if any(a == "--text-stream" or a.startswith("--text-stream=") for a in argv):
        return run_text_stream(argv)
    return run_bag(bag_parser(prog).parse_args(argv), targets)
