"""The official SDK's module path ``tinker.types.get_info_response``.

Its names are defined once, in ``types/__init__``.
"""

from tinker_cookbook.tinker.types import GetInfoResponse, ModelData

__all__ = ["GetInfoResponse", "ModelData"]
