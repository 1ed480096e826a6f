"""The engine's ingest side, one job a module: the still-frame test (``still``), the vision stage
(``vision_stage``), the frame tables of poses and words (``frame_tables``), the caps (``caps``) and the
pipeline that runs a frame through the decoder and the policy (``ingest_pipeline``)."""
