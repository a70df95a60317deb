"""The kernels room: every compiled path of the engine, each with a plain torch fallback.

``decode_kernel`` (a C library built on first use: the sampler's decode step and small matmuls) and ``onednn``
(oneDNN's pre-packed weight matmuls, a private torch op). ``$TINKER_COOKBOOK_COMPILED=0`` turns all of them off
(see ``tinker_cookbook.engine.settings``).
"""
