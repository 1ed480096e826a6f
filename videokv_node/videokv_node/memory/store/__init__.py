"""Where blocks live: the unit of memory (``block``), its two tiers (``block_store``: resident on the
model's device, offloaded to a host arena allocated once, ``host_arena``), the retrieval index of
every held block's representatives (``block_index``) and exact partial sorts (``top_k``).

Nothing here decides which block stays or leaves (the policies do) or builds a context from blocks
(``memory/context/``). Empty on purpose: import the module you need, so importing one part never
loads the others.
"""
