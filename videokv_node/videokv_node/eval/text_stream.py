"""``python -m videokv_node.eval --text-stream FRAMES.jsonl QUESTIONS.json``: the replay evaluation on text frames.

    python -m videokv_node.eval --text-stream needles-000.jsonl questions.json --out DIR \\
        --model smollm2 --policy rekv --param memory.retrieve_frames=4 [--option-scoring likelihood|letter|cloze|both|all]

The same incremental evaluation as a bag replay (``replay.py``), for a causal text LM whose
frames are short texts (``models/text_lm.py``; ``--model smollm2`` or ``tiny-text``): frames
are ingested one at a time in stamp order, each question is asked at its ``end_time``
(seconds from the stream's start, the JSONL stamps' origin; a question exactly at a frame's
stamp sees that frame), and nothing is re-encoded for a question. Every frame of the file
enters memory: sampling (``--sample-fps``) is for cameras and is not applied to text.
Results go through ``ResultWriter``, one row per question and option-scoring method
(``--option-scoring both``, the default, writes a ``letter`` and a ``likelihood`` row for each
multiple-choice question, the node's two ways; ``all`` adds ``cloze``; open questions are
generated once). The entry of the question file
is ``--video-id``, else the one named like the frames file (``needles-000.jsonl`` ->
``needles-000``), else the only one.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from tqdm import tqdm

from videokv_node.eval.arguments import RUN_ERROR, USAGE_ERROR, memory_arguments, memory_parameters
from videokv_node.eval.option_scoring import METHODS, choose_option
from videokv_node.eval.questions import EvalQuestion, QuestionFileError, load_questions, select_video
from videokv_node.eval.replay import END_SLACK_S, _ask
from videokv_node.eval.results import ResultWriter
from videokv_node.eval.target import AskRefused, MemoryState, Reply
from videokv_node.eval.text_frames import TextFrameRecord, TextStreamError, load_text_frames
from videokv_node.memory.config import OPTION_SCORINGS, ConfigError
from videokv_node.memory.question import Question, RequestError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The text-stream options (``--text-stream`` itself is added by ``eval/cli.py``)."""
    parser.add_argument("--out", type=Path, required=True, help="directory for results.csv, summary.json, plots, report.md")
    parser.add_argument("--video-id", help="entry of the question file (default: the frames file's stem, or the only entry)")
    parser.add_argument("--option-scoring", choices=(*METHODS, "both", "all"), default="both",
                        help="multiple choice: likelihood (mean log-probability per token), letter (the option letters' logits), "
                             "cloze (summed log-probability), both (the node's two, one row each) or all")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    memory_arguments(parser)
    parser.set_defaults(model="smollm2")


class TextTarget:
    """The engine in-process over a text LM (an ``EvalTarget[TextFrameRecord]``, eval/target.py); answers as
    ``replay.EngineTarget`` does, for ``replay._ask``."""

    via = "engine"

    def __init__(self, settings) -> None:
        from videokv_node.memory.engine import VideoMemoryEngine
        from videokv_node.models.factory import load_adapter
        from videokv_node.models.text_lm import TextLMAdapter
        from videokv_node.process_settings import apply_process_settings

        apply_process_settings(settings.torch_threads)  # one thread runs the engine here: Python's own switch interval
        adapter = load_adapter(settings.model, settings.device, settings.dtype, settings.seed, text_frames=True)
        assert isinstance(adapter, TextLMAdapter)  # load_adapter's guarantee with text_frames
        self.engine = VideoMemoryEngine(adapter, settings.memory, settings.generation)
        self.method = "letter"  # how the next multiple-choice question is scored (set per row)
        self.encode_ms: list[float] = []

    def check(self, frames: list[TextFrameRecord]) -> None:
        """Refuse (TextStreamError) a stream with a frame too long for the model, before any is encoded."""
        from videokv_node.models.text_lm import stamp_text

        for i, frame in enumerate(frames, start=1):
            try:
                self.engine.adapter.frame_ids(stamp_text(frame.stamp_s, frame.text))
            except ValueError as exc:
                raise TextStreamError(f"frame {i} (stamp {frame.stamp_s} s): {exc}") from exc

    def offer(self, frame: TextFrameRecord) -> None:
        from videokv_node.models.text_lm import text_frame

        t0 = time.perf_counter()
        self.engine.ingest([text_frame(frame.stamp_s, frame.text)])
        self.encode_ms.append((time.perf_counter() - t0) * 1e3)

    def settle(self) -> None:
        """Nothing to wait for: ``offer`` returns once the frame is encoded."""

    def ask(self, q: EvalQuestion) -> Reply:
        try:
            if q.choices:
                c = choose_option(self.engine, Question(q.question), list(q.choices), self.method)
                return Reply(q.choices[c.index], c.index, list(c.evidence_stamps_ns), c.ttft_s, c.total_s, c.method,
                             self.engine.last_layer_stamps, self.engine.last_layer_token_share)
            answer = self.engine.ask(Question(q.question))
        except RequestError as exc:
            raise AskRefused(str(exc)) from exc
        return Reply(answer.text, -1, [e.stamp_ns for e in answer.evidence], answer.ttft_s, answer.total_s, "",
                     self.engine.last_layer_stamps, self.engine.last_layer_token_share)

    def memory(self) -> MemoryState:
        s = self.engine.stats()
        return MemoryState(s.frames_in_memory, s.tokens_resident, s.bytes_resident, s.bytes_offloaded, sum(self.encode_ms))

    def close(self) -> None:
        self.engine.close()


def evaluate(frames: list[TextFrameRecord], video, target: TextTarget, writer: ResultWriter, methods: tuple[str, ...],
             progress: bool = True) -> dict:
    """Ingest ``frames`` in order, asking ``video``'s questions at their end_time with each method."""
    pending = list(video.questions)  # in end_time order (load_questions guarantees it)
    end_s = frames[-1].stamp_s
    # Before the first frame there is nothing to answer from; after the last, the whole stream answers.
    early = [q for q in pending if q.end_time < frames[0].stamp_s - END_SLACK_S]
    pending = [q for q in pending if q.end_time >= frames[0].stamp_s - END_SLACK_S]

    def ask(q: EvalQuestion) -> None:
        for method in (methods if q.choices else methods[:1]):
            target.method = method
            _ask(target, video.video_id, q, writer)

    for frame in tqdm(frames, unit="frame", desc=video.video_id, disable=not progress):
        while pending and pending[0].end_time < frame.stamp_s:
            ask(pending.pop(0))
        target.offer(frame)
        writer.add_ingest_ms(target.encode_ms[-1])
        s = target.engine.stats()
        writer.add_memory_sample(frame.stamp_s, s.bytes_resident, s.bytes_offloaded)
    for q in pending:
        ask(q)
    for q in early:
        writer.skip(video.video_id, q.question, f"asked at {q.end_time:.3f} s, before the stream's first frame "
                    f"({frames[0].stamp_s:.3f} s): nothing to answer from", q.end_time)
    per_method = {}
    for m in methods:
        judged = [r for r in writer.rows if r.method == m and r.correct is not None]
        per_method[m] = {"accuracy": sum(bool(r.correct) for r in judged) / len(judged) if judged else None, "n": len(judged)}
    return {"text_stream": {"frames": len(frames), "duration_s": end_s, "methods": list(methods)},
            "accuracy_per_method": per_method,
            "ingest_ms_source": "measured per frame around engine.ingest (decoder prefill, policy)"}


def main(args: argparse.Namespace) -> int:
    from videokv_node.eval.settings import engine_settings

    frames_path, questions_path = (Path(p) for p in args.text_stream)
    methods = {"both": OPTION_SCORINGS, "all": METHODS}.get(args.option_scoring, (args.option_scoring,))
    try:
        params = memory_parameters(args)
        settings = engine_settings(params)
        frames = load_text_frames(frames_path)
        video = select_video(load_questions(questions_path), args.video_id or frames_path.stem)
        if args.video_id and video.video_id != args.video_id:
            raise QuestionFileError(f"no video_id {args.video_id!r} in {questions_path}")
    except (ConfigError, ValueError, QuestionFileError, TextStreamError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return USAGE_ERROR
    try:
        target = TextTarget(settings)
    except Exception as exc:  # noqa: BLE001 - a model that cannot load: nothing run, nothing to keep
        print(f"error: {exc}", file=sys.stderr)
        return USAGE_ERROR
    try:
        target.check(frames)
    except TextStreamError as exc:
        target.close()
        print(f"error: {frames_path}: {exc}", file=sys.stderr)
        return USAGE_ERROR
    config = {"text_stream": str(frames_path), "questions": str(questions_path), "video_id": video.video_id,
              "via": "engine", "option_scoring": list(methods), "parameters": params, "settings": settings}
    writer = ResultWriter(args.out, config)
    extra, code = {}, 0
    try:
        extra = evaluate(frames, video, target, writer, methods, progress=not args.no_progress)
    except KeyboardInterrupt:
        extra, code = {"run_error": "interrupted"}, RUN_ERROR
    except Exception as exc:  # noqa: BLE001 - whatever failed, the rows so far are summarised
        extra, code = {"run_error": f"{type(exc).__name__}: {exc}"}, RUN_ERROR
        print(f"error: the run failed part-way: {exc}", file=sys.stderr)
    finally:
        target.close()
        summary = writer.finish(extra)
    acc = summary["accuracy"]
    per = ", ".join(f"{m} {v['accuracy']:.3f}" for m, v in summary.get("accuracy_per_method", {}).items()
                    if v["accuracy"] is not None)
    print(f"{summary['questions_answered']} rows, {summary['questions_skipped']} skipped, accuracy "
          f"{'n/a' if acc is None else f'{acc:.3f}'}{f' ({per})' if per else ''}; results in {args.out}")
    return code
