"""The official SDK's ``tinker.lib`` package path; only ``lib.public_interfaces`` is provided."""
