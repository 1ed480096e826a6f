"""The vision-backend bench's report: a GPU run gets its own span and says why a backend is missing.

Rendered from hand-made results (no model is built), so the text and the spans are what is checked.
"""

from __future__ import annotations

from dataclasses import replace

from bench import vision_backends as vb
from bench.machine import Machine
from bench.timing import Summary

CPU = Machine(cpu="Test CPU", cores=2, ram_gib=24.0, gpu="no GPU", torch="2.x", torch_threads=2, transformers="5.x",
              python="3.11", commit="abc1234", date="2026-11-26T00:00:00+00:00", load_start=(0.1, 0.1, 0.1))
GPU = replace(CPU, gpu="NVIDIA H200", cores=16)


def result(device: str, skipped: dict[str, str]) -> vb.Result:
    rows = [vb.Row("torch:" + device, 1, Summary.of([0.011, 0.012]))]
    return vb.Result(device, "float16", 430_000_000, 30.0, "not measured: no tensorrt", rows, {}, skipped)


def test_gpu_run_names_each_backend_it_could_not_measure_and_no_cpu_excuse():
    text = vb.render(result("cuda:0", {"onnxruntime": "no CUDAExecutionProvider"}), GPU, "cmd", 40.0, (1, 1, 1))
    assert "onnxruntime: not measured: no CUDAExecutionProvider." in text
    assert "TensorRT: not measured: no tensorrt." in text
    assert "needs a GPU" not in text
    assert "| torch:cuda:0 | 1 | 2 |" in text


def test_cpu_run_points_to_the_gpu_table():
    text = vb.render(result("cpu", {}), CPU, "cmd", 40.0, (1, 1, 1))
    assert "TensorRT needs a GPU: its rows are in the GPU table" in text
    assert "not measured: no CUDA" not in text


def test_gpu_and_cpu_sections_keep_each_other(tmp_path):
    doc = tmp_path / "B.md"
    vb.update_document(doc, "CPU TABLE")
    vb.update_document(doc, "GPU TABLE", gpu=True)
    vb.update_document(doc, "CPU TABLE 2")
    text = doc.read_text()
    assert "CPU TABLE 2" in text and "GPU TABLE" in text and "CPU TABLE\n" not in text
    assert text.index(vb.BEGIN_GPU) > text.index(vb.END)
