"""The official SDK's module path ``tinker.lib.public_interfaces.rest_client``."""

from tinker_cookbook.tinker.rest_client import RestClient

__all__ = ["RestClient"]
