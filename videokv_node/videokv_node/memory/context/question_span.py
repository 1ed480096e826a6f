"""Where a question's own tokens lie in the prompt that follows the frames.

ReKV retrieves with the question's own tokens ("Only input the question to perform
retrieval", ``question_answering`` in Becomebright/ReKV), not the chat template around it
nor the listed options; ``memory.rekv.query: question`` averages the retrieval query over
these tokens only (``retrieval_cache.QueryCapture``'s ``rows``).
"""

from __future__ import annotations

from videokv_node.models.adapter import VideoLLMAdapter


def question_span(adapter: VideoLLMAdapter, question: str, options: list[str]) -> slice:
    """The rows of ``adapter.question_ids(question, options)`` that are the question's own tokens.

    Found against the same template with an empty question: the longest common prefix
    and suffix of the two token lists are template; what lies between is the question
    (a token a BPE merged across the question's edge, e.g. ``?\\n``, counts as question).
    Always at least one row; the whole prompt if no row is the question's alone.
    """
    full = adapter.question_ids(question, options)
    empty = adapter.question_ids("", options)
    start = 0
    while start < min(len(full), len(empty)) and full[start] == empty[start]:
        start += 1
    end = len(full)
    while end > start and len(full) - end < len(empty) - start and full[end - 1] == empty[len(empty) - (len(full) - end) - 1]:
        end -= 1
    return slice(start, end) if end > start else slice(0, len(full))
