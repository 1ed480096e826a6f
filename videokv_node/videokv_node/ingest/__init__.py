"""From camera messages to frames worth remembering.

``image_decode`` turns the plain fields of sensor_msgs/Image and CompressedImage
into (H, W, 3) uint8 RGB arrays; ``sampler`` picks which frames enter memory by
header stamp. Neither imports ROS: the node passes message fields.
"""

from videokv_node.ingest.image_decode import (
    DEFAULT_MAX_PIXELS,
    SUPPORTED_ENCODINGS,
    ImageDecodeError,
    decode_compressed_image,
    decode_raw_image,
    encode_compressed_image,
    encode_raw_image,
)
from videokv_node.ingest.sampler import (
    NS_PER_S,
    CameraCounters,
    FrameSampler,
    SampleDecision,
    SamplerConfig,
    stamp_to_ns,
)

__all__ = [
    "DEFAULT_MAX_PIXELS",
    "NS_PER_S",
    "SUPPORTED_ENCODINGS",
    "CameraCounters",
    "FrameSampler",
    "ImageDecodeError",
    "SampleDecision",
    "SamplerConfig",
    "decode_compressed_image",
    "decode_raw_image",
    "encode_compressed_image",
    "encode_raw_image",
    "stamp_to_ns",
]
