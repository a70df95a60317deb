"""The engine over HTTP: OpenAI-compatible routes and the Tinker wire protocol, served by ``tinker-cookbook serve``.

::

    tinker-cookbook serve --port 8000                    # loopback only, no key needed
    tinker-cookbook serve --host 0.0.0.0 --generate-api-key

    from openai import OpenAI
    client = OpenAI(base_url="http://127.0.0.1:8000/v1", api_key="-")
    client.chat.completions.create(model="tinker://RUN/sampler_weights/final", messages=[...])

The server is an adapter over the API's ``Backend`` interface (``tinker_cookbook.tinker.backend``); it never
imports the engine itself. ``create_app`` builds the app (``app.py``: key check, body limit, error format;
``guards``: the Host, Origin and Content-Type checks and the scrubbing of machine paths from answers;
``json_input``: the one reader of JSON bodies), ``openai_api`` mounts the OpenAI routes (``openai_routes``, one
module per sampling route, over ``openai_bodies`` and ``openai_models``), ``tinker_api`` mounts the Tinker
protocol's (``tinker_routes``, one module per route group), ``running`` serves it with uvicorn.
"""

from tinker_cookbook.base.hosts import is_loopback
from tinker_cookbook.server.app import ServerLimits, create_app
from tinker_cookbook.server.running import BackgroundServer, generate_api_key, serve

__all__ = ["BackgroundServer", "ServerLimits", "create_app", "generate_api_key", "is_loopback", "serve"]
