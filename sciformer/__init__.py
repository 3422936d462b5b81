"""sciformer: Transformers for 3D point clouds and hyperspectral image cubes."""

__version__ = "0.1.0"

__all__ = ["__version__"]
