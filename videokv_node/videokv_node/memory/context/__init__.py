"""Blocks turned into what the decoder reads: what gets encoded (``encoding``), the transformers
``Cache`` a question attends to (``retrieval_cache``), the resident context kept in preallocated
buffers (``resident_cache``), where a question's tokens lie in the prompt (``question_span``), what
happens to the assembled context after the question's prefill (``question_stage``: TGV-KV) and
what a question attended to (``attended``).

Built on ``memory/store/``; never imports a policy or the engine. Empty on purpose: import the
module you need.
"""
