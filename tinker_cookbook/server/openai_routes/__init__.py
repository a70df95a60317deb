"""The OpenAI-compatible sampling routes, one module per route (``completions``, ``chat``);
``openai_api.build_router`` mounts them with ``/v1/models``.

``common`` holds what both routes share: the call to the sampler, the choices they answer with, usage, and the
pieces of a streamed answer.
"""
