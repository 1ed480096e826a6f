"""The self-trained ``videokv-tiny``'s data, training and evaluation (its adapter is ``models/videokv_tiny.py``).

``scenes``: rendered scenes with known answers and real photos, and the questions about them;
``variety``: free shapes on varied backgrounds, and what is held out of training; ``story``: the
demo's camera story; ``train``: ``python -m videokv_node.tinyvlm.train``; ``evaluate``:
``python -m videokv_node.tinyvlm.evaluate``, held-out accuracy through the memory engine.

Above the memory engine (the evaluation asks it questions) and the adapters; nothing in
``models/`` or ``memory/`` imports it.
"""
