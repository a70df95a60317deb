"""Supervised fine-tuning: datasets of chat conversations, datum construction, the NLL evaluator and the loop.

The loop is ``supervised.train`` (``Config`` + ``main``); ``recipes/sl_basic.py`` runs it and ``recipes/sl_loop.py``
is the same algorithm as one flat script.
"""
