"""Point-cloud readers and datasets.

Importing this package registers the datasets ``modelnet``, ``s3dis``,
``shapenetpart``, ``las_tiles`` and ``point_scenes`` in :data:`sciformer.registry.DATASETS`.

Modules: ``io`` (read_point_file; formats in ``ply``, ``pcd``, ``mesh``, ``las``),
``sample`` (sample layout, packed collation), ``task`` (base dataset and TaskData),
``scenes`` (evaluation on every point of rooms/tiles), ``cache``, and one module per
dataset (``modelnet``, ``s3dis``, ``shapenetpart``, ``lidar``).
"""

from sciformer.data.pointcloud import lidar, modelnet, point_scenes, s3dis, shapenetpart
from sciformer.data.pointcloud.io import (
    read_off,
    read_point_file,
    sample_mesh_surface,
    write_ply,
)
from sciformer.data.pointcloud.sample import collate_points

__all__ = [
    "collate_points", "lidar", "modelnet", "point_scenes", "read_off", "read_point_file",
    "s3dis", "sample_mesh_surface", "shapenetpart", "write_ply",
]
