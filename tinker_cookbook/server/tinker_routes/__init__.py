"""The Tinker protocol's routes, one module per route group; ``tinker_api.build_router`` mounts them all.

Each group is a function ``add_routes(routes, ...)`` that registers its handlers on the shared ``Routes`` (the
backend, the protocol's bookkeeping and the router); ``common`` holds what every group uses: registration, body
parsing and the encoding of answers and errors.
"""
