"""Hardware catalogue: GPU devices (peak FLOP/s, memory) and cluster topologies (levels of links)."""

from trainsim.hardware.cluster import (
    CLUSTERS,
    LEVEL_KINDS,
    Cluster,
    Level,
    custom_cluster,
    get_cluster,
)
from trainsim.hardware.devices import DEVICES, DTYPES, Device, get_device

__all__ = [
    "CLUSTERS",
    "DEVICES",
    "DTYPES",
    "LEVEL_KINDS",
    "Cluster",
    "Device",
    "Level",
    "custom_cluster",
    "get_cluster",
    "get_device",
]
