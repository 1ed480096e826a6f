"""The vision path of a Video-LLM run through TensorRT, onnxruntime or PyTorch (``vision.backend``).

``config`` holds the settings, ``export`` writes the adapter's whole vision path to ONNX,
``engine_cache`` keeps TensorRT engines safely on disk, ``tensorrt_engine`` builds and runs
them, ``backends`` are the runners and ``selection`` picks one. No rclpy here.
"""

from videokv_node.vision.config import VisionConfig

__all__ = ["VisionConfig"]
