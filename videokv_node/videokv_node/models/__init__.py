"""Model adapters: the Video-LLMs the memory engine drives, behind ``VideoLLMAdapter``."""

from videokv_node.models.adapter import KVGeometry, VideoLLMAdapter
from videokv_node.models.factory import ModelLoadError, load_adapter

__all__ = ["KVGeometry", "VideoLLMAdapter", "ModelLoadError", "load_adapter"]
