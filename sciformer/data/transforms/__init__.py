"""Point-cloud transforms: callables on a sample dict of numpy arrays.

A sample holds ``coord`` (n, 3) and any per-point arrays (first dimension n:
``colour`` (n, 3) in [0, 1], ``normal`` (n, 3), ``intensity`` (n,), ``label`` (n,),
``feat`` (n, c), ...) plus per-sample values (``label`` () for classification,
``category`` ()). Transforms that drop or reorder points apply the same index to
every per-point array; geometric ones move ``coord`` and rotate/flip ``normal``.

Randomness comes from the ``rng`` argument (a ``numpy.random.Generator``)::

    t = Compose([RandomRotate(axis="z"), RandomScale((0.9, 1.1))])
    sample = t(sample, rng=np.random.default_rng(0))

Datasets pass a generator seeded per worker (and epoch) so runs are reproducible;
without ``rng`` a transform falls back to its own unseeded generator.

From YAML, a list of ``{name: ..., <params>}`` is validated by
:func:`build_transforms` (unknown names or parameters raise ConfigError)::

    - {name: random_rotate, axis: z, angle: [-180, 180]}
    - {name: random_jitter, sigma: 0.01, clip: 0.05}

Modules: ``base`` (sample helpers, ``Transform``, ``Compose``, ``ToTensor``),
``geometric``, ``colour``, ``sampling`` and ``build`` (names -> transforms).
"""

from sciformer.data.transforms.base import (
    NON_POINT_KEYS,
    Compose,
    Sample,
    ToTensor,
    Transform,
    index_points,
    num_points,
    point_keys,
)
from sciformer.data.transforms.build import (
    TRANSFORMS,
    TransformList,
    build_transform,
    build_transforms,
    check_transform_specs,
    transform_names,
)
from sciformer.data.transforms.colour import ChromaticAutoContrast, ChromaticJitter
from sciformer.data.transforms.geometric import (
    CenterShift,
    NormalizeScale,
    RandomFlip,
    RandomJitter,
    RandomRotate,
    RandomScale,
    rotation_matrix,
)
from sciformer.data.transforms.sampling import (
    FixedPoints,
    GridSample,
    RandomDropout,
    RandomSample,
    ShufflePoints,
    SphereCrop,
    grid_sample_indices,
    point_values,
)

__all__ = [
    "Compose", "CenterShift", "NormalizeScale", "RandomRotate", "RandomScale", "RandomJitter",
    "RandomFlip", "ChromaticAutoContrast", "ChromaticJitter", "RandomDropout", "ShufflePoints",
    "RandomSample", "FixedPoints", "GridSample", "SphereCrop", "ToTensor", "Transform",
    "NON_POINT_KEYS", "Sample", "num_points", "TRANSFORMS", "build_transform", "build_transforms", "check_transform_specs",
    "TransformList",
    "grid_sample_indices", "index_points", "point_keys", "point_values", "rotation_matrix", "transform_names",
]
