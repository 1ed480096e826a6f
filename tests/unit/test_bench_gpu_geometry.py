"""bench/gpu_geometry.py: its geometries are the checkpoints' and its whole path runs (on the CPU here).

The GPU figures of docs/bench/gpu.md come from this module on a lent H200; CI has no GPU, so
this runs the same code at a tiny ``test`` geometry in bfloat16 on the CPU, and checks the
0.5B and 7B shapes against the published model cards' numbers written out here.
"""

from __future__ import annotations

import json

from bench import gpu_geometry


def kv_bytes_per_token(text: dict, dtype_bytes: int = 2) -> int:
    head_dim = text["hidden_size"] // text["num_attention_heads"]
    return text["num_hidden_layers"] * 2 * text["num_key_value_heads"] * head_dim * dtype_bytes


def test_the_geometries_are_qwen2_0_5b_and_7b():
    # Qwen2-0.5B: 24 layers, 2 KV heads of 64; Qwen2-7B: 28 layers, 4 KV heads of 128 (config.json of each).
    assert kv_bytes_per_token(gpu_geometry.TEXT["0.5b"]) == 24 * 2 * 2 * 64 * 2
    assert kv_bytes_per_token(gpu_geometry.TEXT["7b"]) == 28 * 2 * 4 * 128 * 2
    assert gpu_geometry.TEXT["7b"]["intermediate_size"] == 18944
    assert gpu_geometry.VISION["image_size"] // gpu_geometry.VISION["patch_size"] == 27  # 729 patches, pooled to 196


def test_a_run_writes_its_table_and_rows(tmp_path):
    out = tmp_path / "geometry.md"
    assert gpu_geometry.main(["--geometries", "test", "--device", "cpu", "--frames", "14", "--repeats", "1", "--out", str(out)]) == 0
    (row,) = json.loads(out.with_suffix(".json").read_text())
    assert row["dtype"] == "bfloat16" and row["frames"] == 14
    assert set(row["ttft_mc_ms"]) == {"11", "14"}  # asked at a quarter (at least a full window + 1) and at the end
    assert row["ingest_mean_ms"] > 0 and row["context_tokens"] > 0
    assert "| test | cpu | bfloat16 |" in out.read_text()
