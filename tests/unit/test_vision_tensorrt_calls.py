"""What ``tensorrt_engine`` asks of TensorRT, checked against a recording stand-in of the ``tensorrt`` module.

This is not TensorRT (test_vision_tensorrt.py runs the real one on a GPU): it pins down
the sequence the code relies on, so a change that drops the profile, the precision flag
or the parser's error report fails here, on every machine.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from videokv_node.vision.engine_cache import EngineCacheError
from videokv_node.vision.export import INPUT_NAME, OUTPUT_NAME, OnnxExport
from videokv_node.vision.tensorrt_engine import TensorRTRunner, build_serialized_engine

EXPORT = OnnxExport(Path("/cache/onnx/m/model.onnx"), "ab" * 32, (3, 384, 384), (196, 896), None)


class FakeTRT:
    """Records builder calls; ``parse_ok``/``engine`` choose what parsing and building return."""

    __version__ = "10.9.0"

    def __init__(self, parse_ok=True, engine=b"plan", names=(INPUT_NAME, OUTPUT_NAME)) -> None:
        self.calls: list[tuple] = []
        fake = self

        class Logger:
            WARNING = 2

            def __init__(self, level) -> None:
                pass

        class MemoryPoolType:
            WORKSPACE = "workspace"

        class BuilderFlag:
            FP16 = "fp16"
            INT8 = "int8"

        class Profile:
            def set_shape(self, name, low, opt, high):
                fake.calls.append(("set_shape", name, tuple(low), tuple(opt), tuple(high)))

        class Config:
            def set_memory_pool_limit(self, pool, size):
                fake.calls.append(("pool", pool, size))

            def set_flag(self, flag):
                fake.calls.append(("flag", flag))

            def add_optimization_profile(self, profile):
                fake.calls.append(("add_profile",))

        class Builder:
            def __init__(self, logger) -> None:
                pass

            def create_network(self, flags):
                fake.calls.append(("create_network", flags))
                return object()

            def create_builder_config(self):
                return Config()

            def create_optimization_profile(self):
                return Profile()

            def build_serialized_network(self, network, config):
                fake.calls.append(("build",))
                return engine

        class OnnxParser:
            def __init__(self, network, logger) -> None:
                self.num_errors = 0 if parse_ok else 2

            def parse_from_file(self, path):
                fake.calls.append(("parse_from_file", path))
                return parse_ok

            def get_error(self, i):
                return f"node {i}: unsupported op"

        class Engine:
            num_io_tensors = len(names)

            def get_tensor_name(self, i):
                return names[i]

            def create_execution_context(self):
                return object()

        class Runtime:
            def __init__(self, logger) -> None:
                pass

            def deserialize_cuda_engine(self, data):
                return Engine() if data == b"plan" else None

        self.Logger, self.MemoryPoolType, self.BuilderFlag = Logger, MemoryPoolType, BuilderFlag
        self.Builder, self.OnnxParser, self.Runtime = Builder, OnnxParser, Runtime


@pytest.mark.parametrize("precision,flags", [("fp16", ["fp16"]), ("fp32", [])])
def test_build_parses_the_file_sets_precision_and_the_batch_profile(precision, flags):
    trt = FakeTRT()
    assert build_serialized_engine(trt, EXPORT, precision, max_batch=8) == b"plan"
    assert ("parse_from_file", str(EXPORT.path)) in trt.calls  # from the file: external weights resolve
    assert [c[1] for c in trt.calls if c[0] == "flag"] == flags
    shape = (3, 384, 384)
    assert ("set_shape", INPUT_NAME, (1, *shape), (8, *shape), (8, *shape)) in trt.calls
    assert trt.calls.index(("add_profile",)) < trt.calls.index(("build",))
    assert ("create_network", 0) in trt.calls


def test_a_fixed_batch_graph_gets_a_fixed_profile():
    trt = FakeTRT()
    fixed = OnnxExport(EXPORT.path, EXPORT.sha256, (3, 392, 392), (196, 2048), 1)
    build_serialized_engine(trt, fixed, "fp16", max_batch=8)
    assert ("set_shape", INPUT_NAME, (1, 3, 392, 392), (1, 3, 392, 392), (1, 3, 392, 392)) in trt.calls


def test_parser_errors_and_an_empty_build_are_engine_cache_errors():
    with pytest.raises(EngineCacheError, match="cannot parse .*node 0: unsupported op; node 1: unsupported op"):
        build_serialized_engine(FakeTRT(parse_ok=False), EXPORT, "fp16", 8)
    with pytest.raises(EngineCacheError, match="returned no engine"):
        build_serialized_engine(FakeTRT(engine=None), EXPORT, "fp16", 8)
    with pytest.raises(EngineCacheError, match="int8 needs calibration frames"):
        build_serialized_engine(FakeTRT(), EXPORT, "int8", 8)


def test_runner_refuses_bytes_tensorrt_rejects_and_engines_of_another_graph():
    with pytest.raises(EngineCacheError, match="could not deserialise"):
        TensorRTRunner(FakeTRT(), b"junk", device=None)
    with pytest.raises(EngineCacheError, match="are not"):
        TensorRTRunner(FakeTRT(names=("input", "output")), b"plan", device=None)
    assert TensorRTRunner(FakeTRT(), b"plan", device=None).engine.num_io_tensors == 2


def test_calibration_frames_are_checked_before_any_build(tmp_path):
    import numpy as np

    from videokv_node.models.llava_onevision import LlavaOnevisionAdapter
    from videokv_node.vision.tensorrt_engine import calibration_batches

    adapter = LlavaOnevisionAdapter.tiny()
    for i in range(5):
        np.save(tmp_path / f"{i:03d}.npy", np.full((20, 30, 3), 40 * i, dtype=np.uint8))
    with pytest.raises(EngineCacheError, match="at least 8 frames .* found 5"):
        calibration_batches(adapter, tmp_path, 8)
    batches = list(calibration_batches(adapter, tmp_path, 2))  # full batches only: 5 frames -> 2 batches
    assert [tuple(b.shape) for b in batches] == [(2, *adapter.vision_input_shape)] * 2
    assert all(b.dtype.is_floating_point for b in batches)
