// The grid of the grid kNN kernel (_grid_knn.cpp): cells sized from the data, points sorted
// by cell, and the tables that find a column of cells as one run of points.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <utility>
#include <vector>

#include "../_kernels.h"

namespace sciformer_grid {

constexpr int64_t kMaxCells = int64_t(1) << 20;  // cells per axis
constexpr int64_t kMaxColumns = 400;  // (x, y) columns a query may scan before the KD-tree takes it
constexpr int64_t kMaxScan = 4096;    // points a query may scan in one box before the KD-tree takes it
constexpr int64_t kDenseCells = 4;  // a table of every cell when there are at most this many cells per point
constexpr int64_t kChunk = 512;       // queries per chunk of work (see parallel_for)
constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr float kInfF = std::numeric_limits<float>::infinity();

// Squared float32 distance between two 3-D points (not contracted into fused multiply-adds:
// see setup.py), the one every ranking of the kernel uses.
inline float dist2(const float* p, const float* q) {
  const float dx = p[0] - q[0], dy = p[1] - q[1], dz = p[2] - q[2];
  return dx * dx + dy * dy + dz * dz;
}

// The bits of a float: for non-negative floats (squared distances) they sort as the values do.
inline uint32_t float_bits(float d) {
  uint32_t bits;
  std::memcpy(&bits, &d, sizeof(float));
  return bits;
}

struct Grid {
  double lo[3] = {0, 0, 0}, hi[3] = {0, 0, 0};  // the support's bounding box
  double h = 1;
  int64_t dim[3] = {1, 1, 1};
  std::vector<float> xyz;       // (n, 3) points in cell order
  std::vector<int64_t> ids;     // (n,) their index within the cloud
  std::vector<int64_t> cells;   // (X * Y * Z + 1,) first point of each cell, if not too many
  std::vector<int64_t> cols;    // else (X * Y + 1,) first point of each (x, y) column, if not too many
  // else blocks of 4 x 4 columns in a hash table (open addressing): occupied block -> entry e,
  // whose 16 columns hold points [boff[17 e + j], boff[17 e + j + 1])
  bool blocked = false;
  int64_t bdim1 = 1;            // blocks along y
  std::vector<int64_t> hkey, hentry, boff;
  uint64_t mask = 0;
  int shift = 63;
  std::vector<int32_t> zcell;   // (n,) z cell of each point
  std::vector<float> boxes;     // (6, ceil(n / 64)): box of each run of 64 points (lo x y z, hi x y z), for brute
  double radius = 0;            // typical k-th neighbour distance (fitted_grid)
  double far = kInf;            // queries farther than this from the grid's box go to the KD-tree
  // build's working arrays, kept with the grid: a grid built again (the next call on the
  // same thread) reuses their memory instead of faulting in fresh pages
  std::vector<int64_t> col_, order_, sorted_col_, fill_, by_z_;
  std::vector<int32_t> zc_;
  std::vector<std::pair<uint64_t, int64_t>> kv_, kv_out_;

  // Bytes held, the working arrays included.
  int64_t bytes() const {
    auto b = [](const auto& v) { return int64_t(v.capacity() * sizeof(v[0])); };
    return b(xyz) + b(ids) + b(boxes) + b(cells) + b(cols) + b(hkey) + b(hentry) + b(boff) + b(zcell) + b(col_) +
           b(order_) + b(sorted_col_) + b(fill_) + b(by_z_) + b(zc_) + b(kv_) + b(kv_out_);
  }

  // fn(p0, p1) with the points [p0, p1) of cells (x, y, z0..z1) of each column of the box
  // x0..x1, y0..y1 (inside the grid); a short column is given whole (scanning a few extra
  // points is cheaper than finding where z0..z1 lie). A blocked grid is walked block by
  // block, one hash lookup each. Stops, returning false, when fn returns false.
  template <class F>
  bool each_column(int64_t x0, int64_t x1, int64_t y0, int64_t y1, int64_t z0, int64_t z1, F fn) const {
    if (!cells.empty()) {  // exact: no extra points, no search
      for (int64_t x = x0; x <= x1; ++x)
        for (int64_t y = y0; y <= y1; ++y) {
          const int64_t c = (x * dim[1] + y) * dim[2];
          if (!fn(cells[c + z0], cells[c + z1 + 1])) return false;
        }
      return true;
    }
    if (!cols.empty()) {
      for (int64_t x = x0; x <= x1; ++x)
        for (int64_t y = y0; y <= y1; ++y) {
          const int64_t c = x * dim[1] + y;
          int64_t p0 = cols[c], p1 = cols[c + 1];
          trim_z(p0, p1, z0, z1);
          if (!fn(p0, p1)) return false;
        }
      return true;
    }
    for (int64_t bx = x0 >> 2; bx <= x1 >> 2; ++bx)
      for (int64_t by = y0 >> 2; by <= y1 >> 2; ++by) {
        const int64_t entry = block_entry(bx * bdim1 + by);
        if (entry < 0) continue;
        const int64_t* off = boff.data() + 17 * entry;
        for (int64_t x = std::max(x0, 4 * bx); x <= std::min(x1, 4 * bx + 3); ++x)
          for (int64_t y = std::max(y0, 4 * by); y <= std::min(y1, 4 * by + 3); ++y) {
            const int64_t j = ((x & 3) << 2) | (y & 3);
            int64_t p0 = off[j], p1 = off[j + 1];
            trim_z(p0, p1, z0, z1);
            if (!fn(p0, p1)) return false;
          }
      }
    return true;
  }

  // The entry of an occupied block of columns in the hash table, -1 if empty.
  int64_t block_entry(int64_t block) const {
    for (uint64_t slot = hash(block);; slot = (slot + 1) & mask) {
      if (hkey[slot] == block) return hentry[slot];
      if (hkey[slot] < 0) return -1;
    }
  }

  // Narrow a column's points [p0, p1) to cells z0..z1 when it is long.
  void trim_z(int64_t& p0, int64_t& p1, int64_t z0, int64_t z1) const {
    if (p1 - p0 > 16) {
      const int32_t* zb = zcell.data();
      p0 = std::lower_bound(zb + p0, zb + p1, int32_t(z0)) - zb;
      p1 = std::upper_bound(zb + p0, zb + p1, int32_t(z1)) - zb;
    }
  }

  // The boxes of the runs of 64 points (in cell order: each run lies in a few neighbouring
  // cells), once per grid.
  void block_boxes() {
    const int64_t n = int64_t(ids.size()), nb = (n + 63) / 64;
    if (int64_t(boxes.size()) == 6 * nb) return;
    boxes.assign(6 * nb, 0.f);
    for (int64_t j = 0; j < nb; ++j)
      for (int a = 0; a < 3; ++a) {
        float low = kInfF, high = -kInfF;
        for (int64_t i = 64 * j; i < std::min(n, 64 * j + 64); ++i) low = std::min(low, xyz[3 * i + a]), high = std::max(high, xyz[3 * i + a]);
        boxes[a * nb + j] = low, boxes[(3 + a) * nb + j] = high;
      }
  }

  uint64_t hash(int64_t c) const { return (uint64_t(c) * 0x9E3779B97F4A7C15ull) >> shift; }

  int64_t cell(double v, int a) const {  // unclamped cell coordinate, kept far from overflow
    double c = std::floor((v - lo[a]) / h);
    return int64_t(std::max(-4.0 * kMaxCells, std::min(c, 8.0 * kMaxCells)));
  }
  // Sort key of an (x, y) column: x-major (blocked: block, then column in the block).
  int64_t column_key(int64_t x, int64_t y) const {
    if (blocked) return (((x >> 2) * bdim1 + (y >> 2)) << 4) | ((x & 3) << 2) | (y & 3);
    return x * dim[1] + y;
  }
  // Cell of p, clamped to the grid.
  void clamped_cell(const float* p, int64_t* c) const {
    for (int a = 0; a < 3; ++a) c[a] = std::max<int64_t>(0, std::min(cell(p[a], a), dim[a] - 1));
  }
  // Sort key of a cell: its column's, then z.
  int64_t clamped_key(const float* p) const {
    int64_t c[3];
    clamped_cell(p, c);
    return column_key(c[0], c[1]) * dim[2] + c[2];
  }
};

// (key, index) pairs sorted by key, ties by index (as given, in index order): a stable radix
// sort on 11-bit digits (only the bits in which the keys differ; `out` its second buffer), a
// comparison sort when few.
inline void sort_pairs(std::vector<std::pair<uint64_t, int64_t>>& kv, std::vector<std::pair<uint64_t, int64_t>>& out) {
  const int64_t n = int64_t(kv.size());
  if (n < 1024) {
    std::sort(kv.begin(), kv.end());
    return;
  }
  uint64_t differ = 0;
  for (const auto& p : kv) differ |= p.first ^ kv[0].first;
  out.resize(n);
  std::vector<int64_t> start(2048);
  for (int shift = 0; shift < 64 && (differ >> shift) != 0; shift += 11) {
    if (((differ >> shift) & 2047) == 0) continue;  // a digit every key shares
    std::fill(start.begin(), start.end(), 0);
    for (const auto& p : kv) ++start[(p.first >> shift) & 2047];
    int64_t sum = 0;
    for (auto& c : start) sum += c, c = sum - c;
    for (const auto& p : kv) out[start[(p.first >> shift) & 2047]++] = p;
    kv.swap(out);
  }
}

// Sort `n` points (rows of `pts`) into `g` with cell edge `h` over the box [lo, hi]: a
// counting sort by cell where a table of every cell is small (kDenseCells per point), else
// by column with a table of columns where that fits (two stable counting sorts, by z then by
// column), else a radix sort of the keys and a hash table of the occupied blocks of columns.
SF_CLONES void build(Grid& g, const float* pts, int64_t n, const double* lo, const double* hi, double h) {
  double extent = 0;
  for (int a = 0; a < 3; ++a) extent = std::max(extent, hi[a] - lo[a]);
  g.h = std::max(h, extent / double(kMaxCells - 1));
  if (!(g.h > 0)) g.h = 1;
  for (int a = 0; a < 3; ++a) {
    g.lo[a] = lo[a], g.hi[a] = hi[a];
    g.dim[a] = std::min<int64_t>(kMaxCells, int64_t((hi[a] - lo[a]) / g.h) + 1);
  }
  const int64_t columns = g.dim[0] * g.dim[1], dense = 16 * n + 4096, nz = g.dim[2];
  g.boxes.clear(), g.cells.clear(), g.cols.clear(), g.hkey.clear(), g.hentry.clear(), g.boff.clear();
  g.blocked = columns > dense;
  g.bdim1 = (g.dim[1] + 3) / 4;
  std::vector<int64_t>& col = g.col_;  // each point's column key (no divisions of keys after this)
  std::vector<int32_t>& zc = g.zc_;    // and z cell
  col.resize(n), zc.resize(n);
  for (int64_t i = 0; i < n; ++i) {
    int64_t c[3];
    g.clamped_cell(pts + 3 * i, c);
    col[i] = g.column_key(c[0], c[1]), zc[i] = int32_t(c[2]);
  }
  std::vector<int64_t>& order = g.order_;  // point indices in key order, ties by index
  order.resize(n);
  if (columns <= dense && columns * nz <= kDenseCells * n + 4096) {
    g.cells.assign(columns * nz + 1, 0);
    for (int64_t i = 0; i < n; ++i) ++g.cells[col[i] * nz + zc[i] + 1];
    for (int64_t c = 0; c + 1 < int64_t(g.cells.size()); ++c) g.cells[c + 1] += g.cells[c];
    std::vector<int64_t>& fill = g.fill_;
    fill.assign(g.cells.begin(), g.cells.end() - 1);
    for (int64_t i = 0; i < n; ++i) order[fill[col[i] * nz + zc[i]]++] = i;
  } else if (columns <= dense) {
    g.cols.assign(columns + 1, 0);
    for (int64_t i = 0; i < n; ++i) ++g.cols[col[i] + 1];
    for (int64_t c = 0; c < columns; ++c) g.cols[c + 1] += g.cols[c];
    std::vector<int64_t>& fill = g.fill_;
    fill.assign(g.cols.begin(), g.cols.end() - 1);
    if (nz <= n) {  // two stable counting sorts: by z, then by column (ties keep index order)
      std::vector<int64_t> zstart(nz + 1, 0);
      std::vector<int64_t>& by_z = g.by_z_;
      by_z.resize(n);
      for (int64_t i = 0; i < n; ++i) ++zstart[zc[i] + 1];
      for (int64_t z = 0; z < nz; ++z) zstart[z + 1] += zstart[z];
      for (int64_t i = 0; i < n; ++i) by_z[zstart[zc[i]]++] = i;
      for (int64_t i : by_z) order[fill[col[i]]++] = i;
    } else {
      for (int64_t i = 0; i < n; ++i) order[fill[col[i]]++] = i;
      for (int64_t c = 0; c < columns; ++c)  // by z within a column (ties keep index order)
        if (g.cols[c + 1] - g.cols[c] > 1)
          std::stable_sort(order.begin() + g.cols[c], order.begin() + g.cols[c + 1], [&](int64_t a, int64_t b) { return zc[a] < zc[b]; });
    }
  } else {
    std::vector<std::pair<uint64_t, int64_t>>& kv = g.kv_;  // (key, index)
    kv.resize(n);
    for (int64_t i = 0; i < n; ++i) kv[i] = {uint64_t(col[i] * nz + zc[i]), i};
    sort_pairs(kv, g.kv_out_);
    std::vector<int64_t>& sorted_col = g.sorted_col_;
    sorted_col.resize(n);
    int64_t blocks = 0;
    for (int64_t i = 0; i < n; ++i) {
      order[i] = kv[i].second, sorted_col[i] = col[order[i]];
      blocks += i == 0 || (sorted_col[i] >> 4) != (sorted_col[i - 1] >> 4);
    }
    int bits = 1;
    while ((int64_t(1) << bits) < 2 * blocks) ++bits;
    g.mask = (uint64_t(1) << bits) - 1;
    g.shift = 64 - bits;
    g.hkey.assign(g.mask + 1, -1);
    g.hentry.assign(g.mask + 1, -1);
    g.boff.assign(17 * blocks, 0);
    int64_t entry = 0;
    for (int64_t i = 0; i < n; ++entry) {
      const int64_t block = sorted_col[i] >> 4;
      int64_t* off = g.boff.data() + 17 * entry;
      int64_t e = i;
      for (int j = 0; j < 16; ++j) {  // the block's 16 columns, in key order
        off[j] = e;
        while (e < n && sorted_col[e] == ((block << 4) | j)) ++e;
      }
      off[16] = e;
      uint64_t slot = g.hash(block);
      while (g.hkey[slot] >= 0) slot = (slot + 1) & g.mask;
      g.hkey[slot] = block, g.hentry[slot] = entry;
      i = e;
    }
  }
  g.xyz.resize(3 * n);
  g.zcell.resize(n);
  for (int64_t i = 0; i < n; ++i) {
    const float* p = pts + 3 * order[i];
    g.xyz[3 * i] = p[0], g.xyz[3 * i + 1] = p[1], g.xyz[3 * i + 2] = p[2];
    g.zcell[i] = zc[order[i]];
  }
  g.ids.swap(order);  // the old ids' memory serves the next build's order
}

SF_CLONES void bounds(const float* pts, int64_t n, double* lo, double* hi) {
  for (int a = 0; a < 3; ++a) lo[a] = kInf, hi[a] = -kInf;
  for (int64_t i = 0; i < n; ++i)
    for (int a = 0; a < 3; ++a) lo[a] = std::min(lo[a], double(pts[3 * i + a])), hi[a] = std::max(hi[a], double(pts[3 * i + a]));
}

}  // namespace sciformer_grid
