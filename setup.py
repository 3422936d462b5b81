"""Build of the optional compiled kernels; everything else is in pyproject.toml.

``optional=True``: where no C++ compiler is present the package installs without them:
``sciformer.geometry`` falls back to the KD-tree backends, the fused Point Transformer
attention and the transition down's neighbour selection to torch operations.
"""

from setuptools import Extension, setup


def _point_kernel(
    name: str, source: str | list[str], extra: list[str] | None = None,
    extra_depends: list[str] | None = None, link: list[str] | None = None,
) -> Extension:
    """An optional float kernel sharing ``sciformer/_kernels.h`` (vectorised loops: fused
    multiply-adds and if-converted comparisons need -ffp-contract=fast -fno-trapping-math)."""
    flags = ["-O3", "-std=c++17", "-ffp-contract=fast", "-fno-trapping-math", *(extra or [])]
    depends = ["sciformer/_kernels.h", *(extra_depends or [])]
    sources = [source] if isinstance(source, str) else source
    return Extension(name, sources=sources, depends=depends, language="c++",
                     extra_compile_args=flags, extra_link_args=link or [], optional=True)


setup(
    ext_modules=[
        Extension(
            "sciformer.geometry._grid_knn",
            sources=["sciformer/geometry/_grid_knn.cpp", "sciformer/geometry/_kdline_start.cpp"],
            depends=["sciformer/_kernels.h", "sciformer/geometry/_grid_knn_grid.h",
                     "sciformer/geometry/_grid_knn_search.h"],
            language="c++",
            # no contraction into fused multiply-adds: float32 rankings equal on every CPU
            extra_compile_args=["-O3", "-std=c++17", "-pthread", "-ffp-contract=off"],
            extra_link_args=["-pthread"],
            optional=True,
        ),
        _point_kernel(
            "sciformer.attention._vector_attention",
            ["sciformer/attention/_vector_attention.cpp", "sciformer/attention/_edge_terms.cpp",
             "sciformer/attention/_edge_terms_rows.cpp"],
            # -fopenmp: the chunk loops run on the OpenMP runtime torch's own threads use (its
            # libgomp.so.1 is loaded first, and the same soname resolves to it)
            ["-fopenmp"],
            ["sciformer/attention/_vector_attention_passes.h", "sciformer/attention/_vector_attention_gemm.h"],
            ["-fopenmp"],
        ),
        _point_kernel("sciformer.pointcloud._edge_select_kernel", "sciformer/pointcloud/_edge_select.cpp"),
    ],
)
