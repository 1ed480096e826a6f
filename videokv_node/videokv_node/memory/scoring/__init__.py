"""Pure scoring and selection math of the memory policies, one module per paper.

Small torch functions on plain tensors: no model, no engine, no block store. Each
takes exactly the tensors a policy has at hand (attention probabilities, cached keys,
token ages, budgets) and returns scores or kept indices, so it can be tested on
hand-computed inputs and wired into a policy without either knowing the other.

- ``hermes``: layer roles, recency/attention importance, cross-layer smoothing and
  the summary token of HERMES (arXiv 2601.14724).
- ``mukv``: dual-signal (attention + frequency) token compression and the
  semi-hierarchical rerank of MuKV.
- ``tgvkv``: text-vision layer budgets, text-weighted ranking and text-prioritised
  retention of TGV-KV (arXiv 2606.03075).
- ``queries``: a text's mean query per KV head, what ReKV, StreamKV (criterion) and MuKV
  (question vector) score blocks against.
- ``rekv``: ReKV's block scores (per layer, on the index) and the fused ranks of ``selection: shared``.
- ``contrast``: the temporal contrast of mean keys (``memory.rekv.contrast``, ours, not ReKV's).
- ``top_k``: the one top-k every selection reads (exact partial sorts, one tie rule each).
- ``select_kv`` and ``segmenter``: StreamKV's layer-adaptive KV selection (SelectKV) and its
  online semantic segment partitioning.

Conventions: indices are int64 and ascending wherever they say which tokens are
kept (so kept tokens keep their time order); ties are broken towards the lower
index, so every selection is deterministic.
"""
