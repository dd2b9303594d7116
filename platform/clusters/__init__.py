"""Cluster inventory: clusters, nodes, devices, health and capacity."""
