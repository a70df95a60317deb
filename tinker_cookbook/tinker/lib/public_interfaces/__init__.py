"""The official SDK's ``tinker.lib.public_interfaces``: the clients and ``APIFuture``.

The classes are defined once, in ``tinker_cookbook.tinker``'s modules; this package only gives them the path that
code written for the SDK imports. Not provided: ``AdminClient``, the ``Backcompat*Future`` classes and the
server-side custom-loss handles (``LossHandle``, ``PerDatumLossFn``); ``forward_backward_custom`` takes a plain
loss function.
"""

from tinker_cookbook.tinker.futures import APIFuture
from tinker_cookbook.tinker.rest_client import RestClient
from tinker_cookbook.tinker.sampling_client import SamplingClient
from tinker_cookbook.tinker.service_client import ServiceClient
from tinker_cookbook.tinker.training_client import TrainingClient

__all__ = ["APIFuture", "RestClient", "SamplingClient", "ServiceClient", "TrainingClient"]
