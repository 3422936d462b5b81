"""Build of the optional compiled kernels; everything else is in pyproject.toml.

``optional=True``: where no C++ compiler is present the package installs without them:
``sciformer.geometry`` falls back to the KD-tree backends, the fused Point Transformer
attention and the transition down's neighbour selection to torch operations.
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
        ),
        Extension(
            "sciformer.attention._vector_attention",
            sources=["sciformer/attention/_vector_attention.cpp"],
            depends=["sciformer/_kernels.h"],
            language="c++",
            extra_compile_args=["-O3", "-std=c++17", "-ffp-contract=fast", "-fno-trapping-math", "-fopenmp-simd"],
            optional=True,
        ),
        Extension(
            "sciformer.pointcloud._edge_select_kernel",
            sources=["sciformer/pointcloud/_edge_select.cpp"],
            depends=["sciformer/_kernels.h"],
            language="c++",
            extra_compile_args=["-O3", "-std=c++17", "-ffp-contract=fast", "-fno-trapping-math"],
            optional=True,
        ),
    ],
)
