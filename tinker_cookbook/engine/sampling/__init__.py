"""The sampling room: continuous batching over a compact decoder.

``sampler`` (the engine and its worker thread), ``weights`` (a snapshot's sampling weights), ``steps`` (the work of
one decoder's batch per step) with ``prefill``, ``decoder_model`` (the compact decoder), ``decode`` (one decode
step), ``lora`` (unmerged adapters), ``batch`` (K/V pools and token selection) and ``requests`` (request checks).
"""
