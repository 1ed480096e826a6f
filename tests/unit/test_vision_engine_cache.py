"""The TensorRT engine cache without TensorRT: key, manifest validation, corruption, mismatch, refusal.

The builder and the deserialiser are fakes with the same contract as TensorRT's
(``build`` -> serialised bytes; ``deserialize`` raises or returns None on bad bytes), so
every branch of the cache runs here; only the real TensorRT calls need a GPU
(test_vision_tensorrt.py).
"""

from __future__ import annotations

import json
import logging

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from videokv_node.vision.engine_cache import ENGINE_FILE, MANIFEST_FILE, EngineCache, EngineCacheError, EngineKey

MAGIC = b"ENGINE:"
KEY = EngineKey(
    onnx_sha256="ab" * 32, tensorrt_version="10.13.0", gpu_name="NVIDIA Jetson AGX Orin", compute_capability="8.7",
    precision="fp16", profile=((1, 3, 384, 384), (8, 3, 384, 384), (8, 3, 384, 384)),
)


class FakeTensorRT:
    """Builds b"ENGINE:<n>" engines and deserialises only well-formed ones, counting both."""

    def __init__(self) -> None:
        self.builds = 0
        self.loads = 0

    def build(self) -> bytes:
        self.builds += 1
        return MAGIC + str(self.builds).encode() * 100

    def deserialize(self, data: bytes):
        self.loads += 1
        if not data.startswith(MAGIC):
            raise RuntimeError("Serialization assertion failed: magic tag mismatch")
        return ("engine", data)


def make_cache(tmp_path, rebuild="auto"):
    trt = FakeTensorRT()
    return EngineCache(tmp_path, trt.build, trt.deserialize, rebuild=rebuild), trt


def test_first_load_builds_then_loads_from_disk(tmp_path):
    cache, trt = make_cache(tmp_path)
    first = cache.load_or_build("m-fp16", KEY)
    assert trt.builds == 1 and cache.last_event.startswith("built (no engine cached")
    again, trt2 = make_cache(tmp_path)
    assert again.load_or_build("m-fp16", KEY) == first and trt2.builds == 0 and again.last_event == "loaded"
    engine, manifest = cache.paths("m-fp16")
    doc = json.loads(manifest.read_text())
    assert EngineKey.from_json(doc["key"]) == KEY and doc["engine_bytes"] == len(engine.read_bytes())
    assert sorted(p.name for p in engine.parent.iterdir()) == [ENGINE_FILE, MANIFEST_FILE]  # no temp files left


def test_the_build_is_announced_before_it_starts(tmp_path, caplog):
    cache, trt = make_cache(tmp_path)
    cache.build_hint = "10-30 min on a Jetson"

    def build():
        assert any("building a TensorRT engine" in r.message and "10-30 min on a Jetson" in r.message
                   for r in caplog.records)
        return trt.build()

    cache._build = build
    with caplog.at_level(logging.INFO):
        cache.load_or_build("m", KEY)


@pytest.mark.parametrize("damage", ["truncate", "flip", "empty", "garbage", "delete"])
def test_a_damaged_engine_is_detected_and_rebuilt(tmp_path, damage):
    cache, trt = make_cache(tmp_path)
    cache.load_or_build("m", KEY)
    engine, _ = cache.paths("m")
    data = engine.read_bytes()
    if damage == "truncate":
        engine.write_bytes(data[: len(data) // 2])
    elif damage == "flip":
        engine.write_bytes(data[:-1] + bytes([data[-1] ^ 1]))
    elif damage == "empty":
        engine.write_bytes(b"")
    elif damage == "garbage":
        engine.write_bytes(b"x" * len(data))
    else:
        engine.unlink()
    reason, trt.loads = cache.check("m", KEY)[1], 0
    assert reason and ("truncated" in reason or "corrupt" in reason or "unreadable" in reason)
    assert cache.load_or_build("m", KEY)[0] == "engine" and trt.builds == 2
    assert trt.loads == 1  # the damaged bytes never reached the deserialiser: the hash caught them
    assert cache.check("m", KEY) == (engine.read_bytes(), "")


def test_an_engine_tensorrt_refuses_is_rebuilt(tmp_path):
    """Bytes that match their manifest but that TensorRT rejects (written by another build): rebuilt."""
    cache, trt = make_cache(tmp_path)
    cache.load_or_build("m", KEY)
    engine, manifest = cache.paths("m")
    bad = b"NOT AN ENGINE"
    engine.write_bytes(bad)
    doc = json.loads(manifest.read_text())
    doc.update(engine_bytes=len(bad), engine_sha256=__import__("hashlib").sha256(bad).hexdigest())
    manifest.write_text(json.dumps(doc))
    assert cache.load_or_build("m", KEY)[0] == "engine" and trt.builds == 2
    assert "refused the cached engine" in cache.last_event


@pytest.mark.parametrize("manifest_text", ["", "{", "[]", '{"format": 1}', '{"format": 99, "key": {}}', "null"])
def test_an_unreadable_manifest_means_rebuild_never_a_crash(tmp_path, manifest_text):
    cache, trt = make_cache(tmp_path)
    cache.load_or_build("m", KEY)
    cache.paths("m")[1].write_text(manifest_text)
    assert cache.check("m", KEY)[0] is None
    cache.load_or_build("m", KEY)
    assert trt.builds == 2 and cache.check("m", KEY)[1] == ""


@pytest.mark.parametrize("field,value", [
    ("onnx_sha256", "cd" * 32), ("tensorrt_version", "10.14.1"), ("gpu_name", "NVIDIA H100 80GB HBM3"),
    ("compute_capability", "9.0"), ("precision", "int8"), ("profile", ((1, 3, 384, 384),) * 3),
])
def test_any_key_field_mismatch_rebuilds_and_says_which(tmp_path, field, value):
    cache, trt = make_cache(tmp_path)
    cache.load_or_build("m", KEY)
    new = EngineKey(**{**KEY.as_json(), field: value, "profile": KEY.profile if field != "profile" else value})
    data, why = cache.check("m", new)
    assert data is None and why.startswith("engine was built for another configuration") and f"{field}:" in why
    cache.load_or_build("m", new)
    assert trt.builds == 2 and cache.check("m", new)[1] == "" and cache.check("m", KEY)[0] is None


def test_never_refuses_a_missing_stale_or_corrupt_engine_with_the_reason(tmp_path):
    cache, trt = make_cache(tmp_path, rebuild="never")
    with pytest.raises(EngineCacheError, match="no engine cached.*build_engine"):
        cache.load_or_build("m", KEY)
    assert trt.builds == 0 and not cache.paths("m")[0].exists()
    make_cache(tmp_path)[0].load_or_build("m", KEY)  # built ahead, as build_engine does
    assert cache.load_or_build("m", KEY)[0] == "engine"
    with pytest.raises(EngineCacheError, match="tensorrt_version: 10.13.0 -> 11.0.0"):
        cache.load_or_build("m", EngineKey(**{**KEY.as_json(), "profile": KEY.profile, "tensorrt_version": "11.0.0"}))
    cache.paths("m")[0].write_bytes(b"ENGINE:")
    with pytest.raises(EngineCacheError, match="truncated"):
        cache.load_or_build("m", KEY)
    assert trt.builds == 0


def test_a_failing_build_is_an_engine_cache_error_and_leaves_no_files(tmp_path):
    def build():
        raise MemoryError("out of workspace")

    cache = EngineCache(tmp_path, build, FakeTensorRT().deserialize)
    with pytest.raises(EngineCacheError, match="failed: out of workspace"):
        cache.load_or_build("m", KEY)
    assert not cache.paths("m")[1].exists()
    cache = EngineCache(tmp_path, lambda: b"garbage", FakeTensorRT().deserialize)
    with pytest.raises(EngineCacheError, match="cannot deserialise the engine it just built"):
        cache.load_or_build("m", KEY)
    assert not cache.paths("m")[0].exists()


def test_a_crash_between_engine_and_manifest_is_caught(tmp_path):
    """Engine renamed into place, manifest still the old one: the hash mismatch triggers a rebuild."""
    cache, trt = make_cache(tmp_path)
    cache.load_or_build("m", KEY)
    cache.paths("m")[0].write_bytes(MAGIC + b"a newer build whose manifest never landed")
    assert "truncated or damaged" in cache.check("m", KEY)[1]
    cache.load_or_build("m", KEY)
    assert trt.builds == 2


@settings(max_examples=40, deadline=None)
@given(st.binary(max_size=64), st.integers(min_value=0, max_value=200))
def test_no_damage_ever_escapes_as_anything_but_a_rebuild(tmp_path_factory, junk, cut):
    """Property: whatever replaces the engine file, load_or_build returns a good engine (auto) and never raises."""
    tmp_path = tmp_path_factory.mktemp("c")
    cache, trt = make_cache(tmp_path)
    good = cache.load_or_build("m", KEY)
    engine = cache.paths("m")[0]
    engine.write_bytes(engine.read_bytes()[:cut] + junk)
    result = cache.load_or_build("m", KEY)
    assert result[0] == "engine" and (result == good or trt.builds == 2)


def test_key_round_trips_through_json():
    assert EngineKey.from_json(json.loads(json.dumps(KEY.as_json()))) == KEY
    assert KEY.differences(KEY) == []
