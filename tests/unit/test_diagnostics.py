"""HealthMonitor on plain numbers: rates, silence levels, drops, evictions, clock resets (no ROS)."""

from __future__ import annotations

import dataclasses

import pytest

from videokv_node.memory.stats import EngineStats
from videokv_node.runtime.health import DROP_WARN_RATIO, HealthConfig, HealthMonitor, Level, ModelInfo, device_memory

NS = 1_000_000_000
T0 = 100 * NS  # node clock at start (sim time, say)
MODEL = ModelInfo(name="tiny", device="cpu", dtype="float32", policy="rekv")
STATS = EngineStats(
    policy="rekv", frames_ingested=0, frames_evicted=0, frames_in_memory=0, tokens_resident=10,
    tokens_offloaded=0, bytes_resident=0, bytes_offloaded=256, budget_tokens=40, budget_offload_bytes=1024,
    oldest_stamp_ns=0, newest_stamp_ns=0, ingest_ms_p50=0.0, ingest_ms_p95=0.0,
)


def report(mon, t_ns, stats=STATS, sampled=0, overflowed=0, dropped=0, alive=True):
    counters = dict(received=0, sampled=sampled, dropped=dropped, answered=0, failed=0)
    return mon.report(t_ns, stats, counters, overflowed, queue_depth=3, queue_size=8, model=MODEL,
                      worker_alive=alive, device_memory={"device_memory": "cpu"})


def by_name(statuses):
    return {s.name: s for s in statuses}


def feed(mon, camera, start_ns, hz, seconds):
    """Frames at ``hz`` from start_ns for ``seconds``; returns the time of the last one."""
    n = int(hz * seconds)
    for i in range(n):
        mon.frame_received(camera, start_ns + i * NS // hz)
    return start_ns + (n - 1) * NS // hz


def test_rate_over_the_window_and_ok():
    mon = HealthMonitor(["/cam_a", "/cam_b"], HealthConfig(silence_warn_s=2.0, silence_error_s=5.0, window_s=5.0))
    report(mon, T0)
    last = feed(mon, "/cam_a", T0, hz=10, seconds=10)  # 100 frames over 10 s, 50 in the last 5 s
    status = by_name(report(mon, last + 1))
    a = status["videokv: camera /cam_a"]
    assert a.level is Level.OK and a.values["input_rate_hz"] == "10.00" and "10.0 Hz" in a.message
    # cam_b never sent: silent since the first clock reading, 10 s > 5 s.
    b = status["videokv: camera /cam_b"]
    assert b.level is Level.ERROR and "silent" in b.message and "no frame yet" in b.message
    assert b.values["last_frame_age_s"] == "never" and b.values["input_rate_hz"] == "0.00"


def test_rate_right_after_start_uses_the_elapsed_span():
    mon = HealthMonitor(["/cam"], HealthConfig(window_s=5.0))
    last = feed(mon, "/cam", T0, hz=4, seconds=2)  # 8 frames over 1.75 s
    s = by_name(report(mon, T0 + 2 * NS))["videokv: camera /cam"]
    assert s.values["input_rate_hz"] == "4.00" and s.level is Level.OK
    assert last < T0 + 2 * NS


def test_silence_goes_warn_then_error_then_recovers_without_restart():
    mon = HealthMonitor(["/cam"], HealthConfig(silence_warn_s=2.0, silence_error_s=5.0))
    last = feed(mon, "/cam", T0, hz=10, seconds=1)
    levels = []
    for dt_s in (1.0, 2.5, 4.9, 5.5, 30.0):
        s = by_name(report(mon, last + int(dt_s * NS)))["videokv: camera /cam"]
        levels.append(s.level)
    assert levels == [Level.OK, Level.WARN, Level.WARN, Level.ERROR, Level.ERROR]
    assert s.message.startswith("silent: no frame for 30.0 s") and s.values["input_rate_hz"] == "0.00"
    back = last + 31 * NS
    mon.frame_received("/cam", back)
    s = by_name(report(mon, back + NS // 10))["videokv: camera /cam"]
    assert s.level is Level.OK and s.values["silent_s"] == "0.10"


def test_a_camera_waiting_for_its_first_frame_is_ok_until_the_warn_threshold():
    mon = HealthMonitor(["/cam"], HealthConfig(silence_warn_s=2.0, silence_error_s=5.0))
    assert by_name(report(mon, T0))["videokv: camera /cam"].message == "waiting for the first frame"
    assert by_name(report(mon, T0 + 3 * NS))["videokv: camera /cam"].level is Level.WARN


def test_sim_time_zero_is_not_a_start():
    """Before the first /clock message the node clock reads 0: silence counts from the first real time."""
    mon = HealthMonitor(["/cam"], HealthConfig(silence_warn_s=2.0, silence_error_s=5.0))
    report(mon, 0)
    s = by_name(report(mon, T0 + NS))["videokv: camera /cam"]
    assert s.level is Level.OK and s.values["silent_s"] == "0.00"


def test_clock_going_back_clears_the_history():
    mon = HealthMonitor(["/cam"], HealthConfig(silence_warn_s=2.0, silence_error_s=5.0))
    feed(mon, "/cam", T0, hz=10, seconds=1)
    s = by_name(report(mon, 10 * NS))["videokv: camera /cam"]  # bag loop: time jumped back 90 s
    assert s.level is Level.OK and s.values["input_rate_hz"] == "0.00" and s.message == "waiting for the first frame"
    assert by_name(report(mon, 13 * NS))["videokv: camera /cam"].level is Level.WARN


def test_memory_ok_values_and_fill():
    mon = HealthMonitor(["/cam"])
    m = by_name(report(mon, T0))["videokv: memory"]
    assert m.level is Level.OK and m.message == "ok"
    v = m.values
    assert v["resident_fill"] == "0.250" and v["offload_fill"] == "0.250"
    assert v["tokens_resident"] == "10" and v["budget_tokens"] == "40"
    assert v["queue_depth"] == "3" and v["queue_size"] == "8"
    assert (v["model"], v["model_device"], v["model_dtype"], v["policy"]) == ("tiny", "cpu", "float32", "rekv")
    assert v["vision_backend"] == "torch" and v["model_state"] == "running" and v["device_memory"] == "cpu"
    assert all(isinstance(x, str) for x in v.values())


def test_queue_drops_above_the_ratio_warn_ingest_falling_behind():
    mon = HealthMonitor(["/cam"], HealthConfig(window_s=5.0))
    report(mon, T0, sampled=100, overflowed=50)  # history before the window does not count
    m = by_name(report(mon, T0 + NS, sampled=200, overflowed=50 + int(100 * DROP_WARN_RATIO)))["videokv: memory"]
    assert m.level is Level.OK and m.values["queue_drop_ratio"] == "0.100"
    m = by_name(report(mon, T0 + 2 * NS, sampled=300, overflowed=80, dropped=30))["videokv: memory"]
    # window: 200 sampled, 30 overflowed since T0 -> 15%
    assert m.level is Level.WARN and "ingest falling behind the sample rate: 15%" in m.message
    assert m.values["sampled_rate_hz"] == "100.00" and m.values["drop_rate_hz"] == "15.00"
    # 10 s later with no new drops the window has moved past them.
    m = by_name(report(mon, T0 + 12 * NS, sampled=400, overflowed=80, dropped=30))["videokv: memory"]
    assert m.level is Level.OK and m.values["queue_drop_ratio"] == "0.000"


def test_evictions_warn_budget_exhausted_and_clear_when_they_stop():
    mon = HealthMonitor(["/cam"], HealthConfig(window_s=5.0))
    full = dataclasses.replace(STATS, tokens_resident=40, frames_evicted=7)
    report(mon, T0, stats=full)
    m = by_name(report(mon, T0 + NS, stats=dataclasses.replace(full, frames_evicted=10)))["videokv: memory"]
    assert m.level is Level.WARN and m.message == "budget exhausted: 3 blocks evicted in the last 1.0 s"
    assert m.values["resident_fill"] == "1.000" and m.values["eviction_rate_hz"] == "3.00"
    m = by_name(report(mon, T0 + 20 * NS, stats=dataclasses.replace(full, frames_evicted=10)))["videokv: memory"]
    assert m.level is Level.OK


def test_dead_worker_is_an_error_and_reasons_combine():
    mon = HealthMonitor(["/cam"])
    report(mon, T0, sampled=0, overflowed=0)
    m = by_name(report(mon, T0 + NS, sampled=10, overflowed=5, alive=False))["videokv: memory"]
    assert m.level is Level.ERROR and m.values["model_state"] == "stopped"
    assert m.message.startswith("model worker stopped") and "; ingest falling behind" in m.message


def test_config_validates():
    with pytest.raises(ValueError):
        HealthConfig(silence_warn_s=5.0, silence_error_s=2.0)
    with pytest.raises(ValueError):
        HealthConfig(silence_warn_s=0.0)


def test_device_memory_on_cpu():
    assert device_memory("cpu") == {"device_memory": "cpu"}
