"""Readers and datasets for point clouds and hyperspectral scenes."""
