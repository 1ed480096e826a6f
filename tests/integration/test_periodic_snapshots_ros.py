"""Periodic snapshots over real DDS: SIGKILL mid-stream loses one period at most; a write that fails WARNs.

The node runs as a separate process fed by this one; it is killed with SIGKILL (no clean-up,
as on power loss or the OOM killer) and restarted with ``memory.restore_on_start: latest``.
"""

from __future__ import annotations

import os
import shutil
import time

import pytest

rclpy = pytest.importorskip("rclpy", reason="ROS 2 (rclpy) is not installed: run `make test`")

from diagnostic_msgs.msg import DiagnosticStatus  # noqa: E402
from rclpy.node import Node  # noqa: E402
from sensor_msgs.msg import Image  # noqa: E402

from tests.integration.test_diagnostics_ros import level, values, watching  # noqa: E402
from tests.integration.test_node_ros import NS, RELIABLE, frame, running_node, wait_subscribed  # noqa: E402
from videokv_node.ros.client import MemoryClient  # noqa: E402
from videokv_node.ros.conversions import time_to_ns  # noqa: E402
from videokv_node.ros.launcher import NodeProcess  # noqa: E402
from videokv_node.ros.synthetic_camera import image_msg  # noqa: E402

WARN = int.from_bytes(DiagnosticStatus.WARN, "little")
OK = int.from_bytes(DiagnosticStatus.OK, "little")
PERIOD_S = 1.0


def params_for(tmp_path) -> dict:
    return {
        "model": "tiny",
        "image_topics": ["cam_p"],
        "camera_qos": "reliable",
        "camera_qos_depth": 200,
        "sample_fps": 0.0,
        "queue_size": 64,
        "stats_period_s": 0.2,
        "diagnostics_period_s": 0.3,
        "memory.policy": "rekv",
        "memory.budget_tokens": 94 + 32 + 16 * 4,
        "memory.local_window_tokens": 32,
        "memory.snapshot_dir": str(tmp_path / "snaps"),
        "memory.snapshot_period_s": PERIOD_S,
        "memory.snapshot_keep": 2,
        "memory.restore_on_start": "latest",
        "max_new_tokens": 4,
    }


def wait_snapshot_after(client: MemoryClient, after_ns: int, timeout: float = 60.0):
    """The stats once a good periodic snapshot taken after ``after_ns`` (node clock) is reported."""
    return client.wait_stats(lambda s: time_to_ns(s.last_snapshot_stamp) > after_ns, timeout=timeout)


def test_sigkill_then_restart_restores_the_latest_snapshot_and_falls_back_past_a_corrupt_one(ros, tmp_path):
    env, ctx = ros
    params = params_for(tmp_path)
    first = NodeProcess(params, env, node_name="videokv_periodic")
    client = MemoryClient(node_name="/videokv_periodic", context=ctx, client_name="videokv_periodic_client")
    peer = Node("videokv_periodic_peer", context=ctx)
    try:
        assert client.wait_ready(timeout=120), first.output()
        assert "no periodic snapshot yet" in first.output()
        pub = peer.create_publisher(Image, "/cam_p", RELIABLE)
        wait_subscribed(pub)
        for i in range(10):
            pub.publish(image_msg(frame(500 + i), (70 + i) * NS))
            time.sleep(0.05)
        done = client.wait_stats(lambda s: s.frames_ingested == 10 and s.queue_depth == 0, timeout=120)
        # Two good snapshots taken after the last frame went in: the newest and its fallback hold all 10.
        wait_snapshot_after(client, time_to_ns(done.header.stamp))
        stats = wait_snapshot_after(client, time_to_ns(client.wait_stats(lambda s: True).last_snapshot_stamp))
        assert stats.snapshots_failed == 0
        before_open = client.ask("What is on the table?")
        before_mc = client.ask("Which?", options=["a cup", "a box", "a cone"])
        assert before_open.success and before_mc.success
        assert first.kill() == -9
    finally:
        peer.destroy_node()
        client.close()
        first.kill()
    snaps = sorted((tmp_path / "snaps").glob("auto-*"))
    assert 1 <= len(snaps) <= 2, snaps  # memory.snapshot_keep: 2 (a write cut by the kill may leave one more temporary)

    with running_node(ros, params, "videokv_periodic2") as (proc, client, _):
        client.wait_stats(lambda s: s.frames_ingested == 10, timeout=60)
        assert "memory restored from" in proc.output()
        after_open = client.ask("What is on the table?")
        after_mc = client.ask("Which?", options=["a cup", "a box", "a cone"])
        assert after_open.answer == before_open.answer
        assert list(after_open.evidence_stamps) == list(before_open.evidence_stamps)
        assert list(after_mc.option_scores) == list(before_mc.option_scores)

    # The newest snapshot torn (its state file cut short): the previous one is restored, the refusal logged.
    snaps = sorted((tmp_path / "snaps").glob("auto-*"))
    assert len(snaps) == 2
    state = snaps[-1] / "state.safetensors"
    state.write_bytes(state.read_bytes()[:-16])
    params["memory.snapshot_period_s"] = 0.0  # nothing new written over the evidence
    with running_node(ros, params, "videokv_periodic3") as (proc, client, _):
        client.wait_stats(lambda s: s.frames_ingested == 10, timeout=60)
        out = proc.output()
        assert f"periodic snapshot {snaps[-1].name} refused" in out and "state.safetensors is corrupt" in out
        assert f"memory restored from {snaps[-2]}" in out
        assert client.ask("What is on the table?").answer == before_open.answer


def test_a_snapshot_directory_that_refuses_writes_warns_and_loses_nothing(ros, tmp_path):
    params = params_for(tmp_path)
    params["memory.restore_on_start"] = ""
    root = tmp_path / "snaps"
    with running_node(ros, params, "videokv_diskfull") as (proc, client, peer), watching(peer, ros[1]) as watcher:
        pub = peer.create_publisher(Image, "/cam_p", RELIABLE)
        wait_subscribed(pub)
        for i in range(4):
            pub.publish(image_msg(frame(600 + i), (80 + i) * NS))
            time.sleep(0.05)
        done = client.wait_stats(lambda s: s.frames_ingested == 4 and s.queue_depth == 0, timeout=120)
        wait_snapshot_after(client, time_to_ns(done.header.stamp))
        watcher.wait("videokv: snapshots", lambda s: level(s) == OK, timeout=30)
        written = {p.name: sorted(f.name for f in p.iterdir()) for p in root.glob("auto-*")}
        # The directory becomes unwritable: a plain file where it was (root ignores permissions).
        os.rename(root, tmp_path / "away")
        root.write_text("not a directory")
        warn = watcher.wait("videokv: snapshots", lambda s: level(s) == WARN, timeout=30)
        assert "the last snapshot write failed" in warn.message and int(values(warn)["failed"]) >= 1
        assert client.wait_stats(lambda s: s.snapshots_failed >= 1, timeout=10).frames_ingested == 4
        assert client.ask("What is on the table?").success  # the node keeps running
        # Back: what was written is intact, and snapshots resume (written whole).
        root.unlink()
        os.rename(tmp_path / "away", root)
        for name, files in written.items():
            if (root / name).exists():
                assert sorted(f.name for f in (root / name).iterdir()) == files
        watcher.wait("videokv: snapshots", lambda s: level(s) == OK, timeout=30)
    assert "periodic snapshot failed, earlier snapshots kept" in proc.output()
    shutil.rmtree(root, ignore_errors=True)
