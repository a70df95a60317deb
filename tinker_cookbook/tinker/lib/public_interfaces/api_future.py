"""The official SDK's module path ``tinker.lib.public_interfaces.api_future``."""

from tinker_cookbook.tinker.futures import APIFuture

__all__ = ["APIFuture"]
