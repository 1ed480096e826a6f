"""Periodic snapshots over real DDS: SIGKILL mid-stream loses one period at most; a torn newest snapshot
falls back, a damaged shared segment costs only its frames; a write that fails WARNs.

The node runs as a separate process fed by this one; it is killed with SIGKILL (no clean-up,
as on power loss or the OOM killer) while a camera thread is still publishing, and restarted with
``memory.restore_on_start: latest``. What it held is judged from what the test can observe: the
stats' node-clock stamps (``last_snapshot_stamp``, header stamps), the frames' header stamps, and
the snapshot names' times; no wall-clock sleeps decide anything (only the camera's pacing is timed).
"""

from __future__ import annotations

import os
import re
import shutil
import threading
import time
from datetime import datetime, timezone
from pathlib import Path

import pytest

rclpy = pytest.importorskip("rclpy", reason="ROS 2 (rclpy) is not installed: run `make test`")

from diagnostic_msgs.msg import DiagnosticStatus  # noqa: E402
from rclpy.node import Node  # noqa: E402
from sensor_msgs.msg import Image  # noqa: E402

from tests.integration.test_diagnostics_ros import level, values, watching  # noqa: E402
from tests.integration.test_node_ros import NS, RELIABLE, frame, running_node, wait_subscribed  # noqa: E402
from videokv_node.programs.client import MemoryClient  # noqa: E402
from videokv_node.ros.conversions import time_to_ns  # noqa: E402
from videokv_node.programs.launcher import NodeProcess  # noqa: E402
from videokv_node.programs.synthetic_camera import image_msg  # noqa: E402

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


FIRST_S = 200  # header stamp (s) of the camera's frame 0; frame i is stamped FIRST_S + i
OLD = dict(since_ns=FIRST_S * NS, until_ns=(FIRST_S + 2) * NS)  # a question about the first three frames only
CAMERA_HZ = 5.0  # five frames a period
STREAM_FRAMES = 600  # the camera stops by itself after two minutes, should the test hang


class Camera(threading.Thread):
    """Publishes frame i, stamped FIRST_S + i seconds, at CAMERA_HZ until stopped: frames keep arriving
    whatever the node does (the pacing is the camera's, as a real one's; nothing waits on it)."""

    def __init__(self, pub) -> None:
        super().__init__(daemon=True, name="camera")
        self.pub = pub
        self.sent = 0  # frames published so far; only this thread writes it
        self._halt = threading.Event()

    def run(self) -> None:
        while self.sent < STREAM_FRAMES and not self._halt.is_set():
            self.pub.publish(image_msg(frame(700 + self.sent), (FIRST_S + self.sent) * NS))
            self.sent += 1
            self._halt.wait(1.0 / CAMERA_HZ)

    def reaches(self, n: int, timeout: float = 30.0) -> bool:
        """Whether ``n`` frames are published within ``timeout`` (False at once if it stopped short)."""
        deadline = time.monotonic() + timeout
        while self.sent < n and self.is_alive() and time.monotonic() < deadline:
            time.sleep(0.01)
        return self.sent >= n

    def stop(self) -> None:
        self._halt.set()
        self.join(10)


def ingested_by(history, stamp_ns: int) -> int:
    """Frames ingested by node-clock time ``stamp_ns``, as the stats published before it say.

    A stats message's header stamp is read just before its counters, so only messages stamped at
    least one stats period (0.2 s) before are counted: a snapshot's copy runs after its tick, so it
    holds every frame those messages counted.
    """
    return max((s.frames_ingested for s in history if time_to_ns(s.header.stamp) <= stamp_ns - NS // 5), default=0)


def taken_ns(name: str) -> int:
    """The node-clock time in a periodic snapshot's name (``auto-<sequence>-<UTC time>Z``)."""
    when = name.split("-", 2)[2].rstrip("Z")
    seconds, _, ns = when.partition(".")
    return int(datetime.strptime(seconds, "%Y%m%dT%H%M%S").replace(tzinfo=timezone.utc).timestamp()) * NS + int(ns)


def test_sigkill_mid_stream_loses_one_period_at_most_and_a_corrupt_newest_falls_back(ros, tmp_path):
    env, ctx = ros
    params = params_for(tmp_path)
    first = NodeProcess(params, env, node_name="videokv_periodic")
    client = MemoryClient(node_name="/videokv_periodic", context=ctx, client_name="videokv_periodic_client")
    peer = Node("videokv_periodic_peer", context=ctx)
    camera = None
    try:
        assert client.wait_ready(timeout=120), first.output()
        assert "no periodic snapshot yet" in first.output()
        pub = peer.create_publisher(Image, "/cam_p", RELIABLE)
        wait_subscribed(pub)
        camera = Camera(pub)
        camera.start()
        # The old frames are in: ask about them while the stream goes on.
        client.wait_stats(lambda s: s.frames_ingested >= 3, timeout=120)
        before_open = client.ask("What is on the table?", **OLD)
        before_mc = client.ask("Which?", options=["a cup", "a box", "a cone"], **OLD)
        assert before_open.success and before_mc.success, (before_open.message, before_mc.message)
        assert before_open.evidence_stamps and all(OLD["since_ns"] <= time_to_ns(t) <= OLD["until_ns"]
                                                   for t in before_open.evidence_stamps)
        # Two periods of frames more, then a good snapshot taken after them is reported: kill at once,
        # with the camera still sending (no clean-up, as on power loss or the OOM killer).
        seen = client.wait_stats(lambda s: s.frames_ingested >= 3 + 2 * CAMERA_HZ * PERIOD_S, timeout=120)
        wait_snapshot_after(client, time_to_ns(seen.header.stamp) + NS // 5)
        assert camera.is_alive(), "the stream ended before the kill"
        assert first.kill() == -9
        history, sent_at_kill = list(client.history), camera.sent
        assert camera.reaches(sent_at_kill + 1), "the camera was still sending when the node was killed"
    finally:
        if camera is not None:
            camera.stop()
        peer.destroy_node()
        client.close()
        first.kill()
    last = history[-1]
    assert last.snapshots_failed == 0 and last.frames_dropped == 0, last
    last_good_ns = time_to_ns(last.last_snapshot_stamp)
    at_last_good = ingested_by(history, last_good_ns)
    assert at_last_good >= seen.frames_ingested
    snaps = sorted((tmp_path / "snaps").glob("auto-*"))
    assert 1 <= len(snaps) <= 2, snaps  # memory.snapshot_keep: 2 (a write cut by the kill leaves only a temporary)

    with running_node(ros, params, "videokv_periodic2") as (proc, client, _):
        restored = client.wait_stats(lambda s: s.frames_ingested > 0, timeout=60)
        out = proc.output()
        path = re.search(r"memory restored from (\S+): ", out)
        assert path, out
        # The snapshot restored is the last good one the stats reported, or one written after it.
        assert taken_ns(Path(path.group(1)).name) >= last_good_ns
        # Memory back to within one period: at least what was ingested by the last good snapshot,
        # and exactly the first frames of the stream (by their header stamps), none made up.
        n = restored.frames_ingested
        assert at_last_good <= n <= camera.sent, (at_last_good, n, camera.sent)
        assert restored.frames_in_memory == n
        assert time_to_ns(restored.oldest_stamp) == FIRST_S * NS and time_to_ns(restored.newest_stamp) == (FIRST_S + n - 1) * NS
        # The same answers about the old frames as before the kill (their blocks restored bit for bit).
        after_open = client.ask("What is on the table?", **OLD)
        after_mc = client.ask("Which?", options=["a cup", "a box", "a cone"], **OLD)
        assert after_open.answer == before_open.answer
        assert list(after_open.evidence_stamps) == list(before_open.evidence_stamps)
        assert list(after_mc.option_scores) == list(before_mc.option_scores)
        wait_snapshot_after(client, 0)  # this node writes the restored memory once: the newest below

    # The newest snapshot torn (its state file cut short): the previous one is restored, the refusal logged.
    snaps = sorted((tmp_path / "snaps").glob("auto-*"))
    assert len(snaps) == 2
    state = snaps[-1] / "state.safetensors"
    state.write_bytes(state.read_bytes()[:-16])
    params["memory.snapshot_period_s"] = 0.0  # nothing new written over the evidence
    with running_node(ros, params, "videokv_periodic3") as (proc, client, _):
        client.wait_stats(lambda s: s.frames_ingested > 0, timeout=60)
        out = proc.output()
        assert f"periodic snapshot {snaps[-1].name} refused" in out and "state.safetensors is corrupt" in out
        assert f"memory restored from {snaps[-2]}" in out
        assert client.ask("What is on the table?", **OLD).answer == before_open.answer

    # And a segment of that snapshot damaged too (shared segments: every snapshot linking it sees it):
    # every other segment is restored, the bad one named in the log with what it cost.
    segments = sorted(snaps[-2].glob("seg-*.safetensors"))  # named by their first block id: oldest first
    assert len(segments) >= 2, segments  # one per period: the oldest frames sit in another segment
    bad = segments[-1]
    data = bytearray(bad.read_bytes())
    data[-5] ^= 0xFF
    bad.write_bytes(bytes(data))
    with running_node(ros, params, "videokv_periodic4") as (proc, client, _):
        stats = client.wait_stats(lambda s: s.frames_ingested > 0, timeout=60)
        out = proc.output()
        assert f"memory restored from {snaps[-2]}" in out and f"{snaps[-2].name} refused" not in out
        loss = re.search(rf"1 segment\(s\) lost, (\d+) blocks and (\d+) frames not restored: {bad.name} \(.*is corrupt", out)
        assert loss, out
        lost_frames = int(loss.group(2))
        assert 0 < lost_frames < stats.frames_ingested and stats.frames_in_memory == stats.frames_ingested - lost_frames
        # The oldest frames were in a good segment: still there, answered from.
        assert time_to_ns(stats.oldest_stamp) == FIRST_S * NS
        answer = client.ask("What is on the table?", **OLD)
        assert answer.success and all(OLD["since_ns"] <= time_to_ns(t) <= OLD["until_ns"] for t in answer.evidence_stamps)


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
