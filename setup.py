"""Build of the optional compiled kNN kernel; everything else is in pyproject.toml.

``optional=True``: where no C++ compiler is present the package installs without it and
``sciformer.geometry`` falls back to the KD-tree backends.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "sciformer.geometry._grid_knn",
            sources=["sciformer/geometry/_grid_knn.cpp"],
            depends=["sciformer/geometry/_grid_knn_grid.h", "sciformer/geometry/_grid_knn_search.h"],
            language="c++",
            extra_compile_args=["-O3", "-std=c++17", "-pthread"],
            extra_link_args=["-pthread"],
            optional=True,
        )
    ],
)
