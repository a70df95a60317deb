"""The official SDK's module path ``tinker.lib.public_interfaces.service_client``."""

from tinker_cookbook.tinker.service_client import ServiceClient

__all__ = ["ServiceClient"]
