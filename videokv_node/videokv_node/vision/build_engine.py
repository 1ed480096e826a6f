"""Build (or check) the vision engine ahead of time, so a robot never builds at start:

    python -m videokv_node.vision.build_engine --model tiny --precision fp16 --cache-dir ~/.cache/videokv/vision

Loads the model as the node would (``--model``, ``--device``, ``--dtype``), exports its vision
path to ONNX and builds the TensorRT engine into the cache the node reads (same key, same
slot). ``--onnx-only`` stops after the export (what a machine without a GPU can do);
``--check`` only says whether a valid engine is cached (exit 0) or not (exit 1, with why).
"""

from __future__ import annotations

import argparse
import logging
import sys

from videokv_node.config_base import ConfigError
from videokv_node.models.factory import ModelLoadError, load_adapter
from videokv_node.vision.backends import BackendUnavailable
from videokv_node.vision.config import PRECISIONS, VisionConfig
from videokv_node.vision.export import ensure_onnx


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="tiny", help="as the node's `model` parameter")
    p.add_argument("--device", default="auto", help="as the node's `device` parameter (TensorRT needs cuda)")
    p.add_argument("--dtype", default="auto", help="as the node's `dtype` parameter")
    p.add_argument("--seed", type=int, default=0, help="as the node's `seed` parameter (tiny models)")
    p.add_argument("--precision", default="fp16", choices=PRECISIONS)
    p.add_argument("--max-batch", type=int, default=8, help="largest batch of the engine's profile (vision.max_batch)")
    p.add_argument("--cache-dir", default="", help="vision.cache_dir; empty: ~/.cache/videokv/vision")
    p.add_argument("--calibration-dir", default="", help="int8: directory of .npy RGB uint8 frames")
    p.add_argument("--onnx-only", action="store_true", help="export the ONNX graph and stop")
    p.add_argument("--check", action="store_true", help="only check the cached engine; never build")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="[%(levelname)s] %(name)s: %(message)s")
    log = logging.getLogger("build_engine")
    try:
        config = VisionConfig(backend="tensorrt", cache_dir=args.cache_dir, precision=args.precision,
                              engine_rebuild="never" if args.check else "auto", max_batch=args.max_batch,
                              calibration_dir=args.calibration_dir)
        adapter = load_adapter(args.model, device=args.device, dtype=args.dtype, seed=args.seed)
    except (ConfigError, ModelLoadError) as exc:
        log.error("%s", exc)
        return 2
    export = ensure_onnx(adapter, config.cache_path)
    log.info("ONNX export: %s (sha256 %s, batch %s)", export.path, export.sha256[:16], export.batch or "dynamic")
    if args.onnx_only:
        return 0
    from videokv_node.vision.selection import VisionBackendError, select_backend, default_factories

    try:
        choice = select_backend(config, default_factories(adapter, config, auto=False))
    except (VisionBackendError, BackendUnavailable) as exc:
        log.error("%s", exc)
        return 1
    log.info("engine ready: %s (%s) in %s", choice.backend.name, getattr(choice.backend, "cache_event", ""),
             config.cache_path / "engines")
    return 0


if __name__ == "__main__":
    sys.exit(main())
