"""The engine's question side, one job a module: reading a question over the policy's selection
(``question_reader``), answering it (``answering``, ``options``), and ``~/locate``'s ranking (``locate``)."""
