"""The official SDK's module path ``tinker.lib.public_interfaces.sampling_client``."""

from tinker_cookbook.tinker.sampling_client import SamplingClient

__all__ = ["SamplingClient"]
