"""The official SDK's module path ``tinker.types.get_server_capabilities_response``.

Its names are defined once, in ``types/__init__``.
"""

from tinker_cookbook.tinker.types import GetServerCapabilitiesResponse, SupportedModel

__all__ = ["GetServerCapabilitiesResponse", "SupportedModel"]
