"""``make demo``: the whole path over ROS 2, end to end, on a synthetic camera.

1. starts the videokv node as its own process (own DDS domain, localhost only);
2. publishes a scripted synthetic scene from a second process (a red "toolbox"
   square that stays, a green "apple", a blue "ball" crossing, a printed 7, a
   yellow cone at the end), with header stamps in scene time;
3. asks through ``~/ask``: a multiple-choice question, an open question and a
   question restricted to a time window; prints answers, evidence stamps, TTFT
   and the memory statistics; exits 0 only if every step worked.

    python -m videokv_node.ros.demo [--model tiny|tiny-qwen2.5-vl|videokv-tiny|DIR] [--policy POLICY] [--question-stage tgvkv]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

import rclpy

from videokv_node.memory.config import POLICIES, QUESTION_STAGES
from videokv_node.ros.client import MemoryClient
from videokv_node.ros.conversions import time_to_ns
from videokv_node.ros.launcher import NodeProcess, isolated_ros_env
from videokv_node.synthetic import SyntheticScene, default_scenario

NS = 1_000_000_000


def show(label: str, resp, t0_ns: int) -> bool:
    print(f"\n--- {label}")
    if not resp.success:
        print(f"    FAILED: {resp.message}")
        return False
    print(f"    answer: {resp.answer!r}")
    if resp.option_index >= 0:
        print("    option scores: " + ", ".join(f"{s:.3f}" for s in resp.option_scores) + f" -> option {resp.option_index}")
    stamps = [f"{(time_to_ns(s) - t0_ns) / NS:.1f}s" for s in resp.evidence_stamps]
    cams = sorted(set(resp.evidence_cameras))
    print(f"    evidence: {len(stamps)} frames from {cams}, at scene times {stamps}")
    print(f"    ttft {resp.ttft_s * 1e3:.1f} ms, total {resp.total_s * 1e3:.1f} ms")
    return True


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--model", default="tiny", help="'tiny', 'tiny-qwen2.5-vl', 'videokv-tiny' or a local LLaVA-OneVision / Qwen2.5-VL checkpoint directory"
    )
    parser.add_argument("--policy", default="rekv", choices=list(POLICIES))
    parser.add_argument("--question-stage", default="none", choices=list(QUESTION_STAGES))
    parser.add_argument("--frames", type=int, default=120, help="scene frames (4 per second of scene time)")
    args = parser.parse_args(argv)

    env = isolated_ros_env()
    fps, topic = 4.0, "camera/front"
    params = {
        "model": args.model,
        "image_topics": [topic],
        "sample_fps": 1.0,
        "queue_size": 64,
        "memory.policy": args.policy,
        "memory.question_stage": args.question_stage,
        "max_new_tokens": 24,
    }
    tiny = not os.path.isdir(os.path.expanduser(args.model))  # a seeded tiny model (the node refuses unknown names)
    if tiny:
        # Small enough that 30 frames overflow the device budget: the demo then shows offloading and
        # per-layer retrieval (16 tokens per frame: window 8 frames, ~18 frames resident, 4 retrieved).
        params.update({"memory.budget_tokens": 400, "memory.local_window_tokens": 128, "memory.retrieve_frames": 4})
    print(f"videokv demo: model {args.model!r}, policy {args.policy}, ROS_DOMAIN_ID {env['ROS_DOMAIN_ID']}")
    if args.model == "videokv-tiny":
        print(
            "NOTE: videokv-tiny is the small self-trained model (EfficientNet-Lite0 + SmolLM2, see README): it sees\n"
            "      for real, but is weak (held-out accuracy in docs/BENCHMARKS.md); expect some wrong answers."
        )
    elif tiny:
        print(
            f"NOTE: the {args.model!r} model has random, untrained weights: it exercises the whole path (ROS API, memory,\n"
            "      retrieval, RoPE) but its answers are meaningless. For real answers run\n"
            "      make demo MODEL=/path/to/llava-onevision-qwen2-0.5b-ov-hf   (a local checkpoint; nothing is downloaded)"
        )
    node = NodeProcess(params, env)
    os.environ.update({k: env[k] for k in ("ROS_DOMAIN_ID", "ROS_AUTOMATIC_DISCOVERY_RANGE", "RMW_IMPLEMENTATION")})
    rclpy.init()
    client = MemoryClient(client_name="videokv_demo")
    ok = True
    try:
        if not client.wait_ready(timeout=120):
            print("node did not come up:\n" + node.output(), file=sys.stderr)
            return 1
        t0_ns = client.node.get_clock().now().nanoseconds
        print(f"\npublishing {args.frames} frames of a synthetic scene on /{topic} from a separate process ...")
        pub = subprocess.run(
            [sys.executable, "-m", "videokv_node.ros.synthetic_camera", "--topic", topic, "--frames", str(args.frames),
             "--fps", str(fps), "--rate", "10", "--start-ns", str(t0_ns)],
            env=env, capture_output=True, text=True, timeout=300,
        )
        if pub.returncode != 0:
            print("publisher failed:\n" + pub.stdout + pub.stderr, file=sys.stderr)
            return 1
        expected = int(args.frames / fps * params["sample_fps"])
        stats = client.wait_stats(lambda s: s.frames_ingested >= expected and s.queue_depth == 0, timeout=300)
        print(f"memory holds {stats.frames_in_memory} frames ({stats.frames_ingested} ingested)")

        scene = SyntheticScene(fps=fps, scenario=default_scenario(args.frames))
        events = {e.name: e for e in scene.events_summary()}
        print("ground truth: " + "; ".join(
            f"{e.colour} {e.shape} '{e.name}' visible {(e.first_stamp_ns) / NS:.1f}-{(e.last_stamp_ns) / NS:.1f}s"
            for e in events.values()))

        ok &= show("multiple choice: 'What colour is the toolbox?'",
                   client.ask("What colour is the toolbox?", options=["red", "green", "blue", "yellow"]), t0_ns)
        ok &= show("open question: 'What did you see on the table?'",
                   client.ask("What did you see on the table?", max_new_tokens=24), t0_ns)
        ball = events.get("ball")
        since = t0_ns + (ball.first_stamp_ns if ball else 0)
        until = t0_ns + (ball.last_stamp_ns if ball else args.frames * NS // int(fps))
        ok &= show(f"time window {(since - t0_ns) / NS:.1f}-{(until - t0_ns) / NS:.1f}s: 'Which object moved across the view?'",
                   client.ask("Which object moved across the view?", options=["a ball", "a cone", "a toolbox"],
                              since_ns=since, until_ns=until), t0_ns)
        bad = client.ask("", options=[])
        print(f"\n--- a malformed request (empty question) is refused: success={bad.success}, message={bad.message!r}")
        ok &= not bad.success

        time.sleep(1.2)
        s = client.stats
        print(
            f"\nmemory_stats: policy {s.policy}, frames received {s.frames_received}, sampled {s.frames_sampled}, "
            f"ingested {s.frames_ingested}, dropped {s.frames_dropped}, evicted {s.frames_evicted}, in memory {s.frames_in_memory}\n"
            f"              tokens resident {s.tokens_resident}/{s.budget_tokens}, offloaded {s.tokens_offloaded} "
            f"({s.bytes_offloaded}/{s.budget_offload_bytes} bytes), ingest p50 {s.ingest_ms_p50:.1f} ms, p95 {s.ingest_ms_p95:.1f} ms, "
            f"questions answered {s.questions_answered}, refused {s.questions_failed}"
        )
    finally:
        client.close()
        rclpy.try_shutdown()
        code = node.stop()
    print(f"\nnode stopped (exit code {code}); demo {'OK' if ok else 'FAILED'}")
    return 0 if ok and code == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
