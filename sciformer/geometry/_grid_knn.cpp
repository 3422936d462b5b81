// Exact k-nearest-neighbour search of 3-D points on a uniform grid of cells, cloud by cloud
// over a packed batch. Loaded with ctypes by sciformer/geometry/grid_knn.py (plain C ABI, no
// Python API; ctypes releases the GIL during the call).
//
// Per cloud: the cell edge is 0.7 R, R the median k-th neighbour distance of a few sample
// queries (brute force on a thinned cloud). The support points are sorted by cell (x-major,
// z fastest) with a dense table of cells, or of (x, y) columns, or a hash of the occupied
// columns where the box is too sparse for either. Queries, taken in cell order, scan the
// cells of the box q +- r (r from the query before) and keep the points within r; with k of
// them the answer is exact, else r grows. A query whose box would span more than
// kMaxColumns columns tries grids 8 and 64 times coarser, then is flagged in `unsettled`
// for the caller's KD-tree. Distances are ranked in float32 and reported from double.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <thread>
#include <vector>

namespace {

constexpr int64_t kMaxCells = int64_t(1) << 20;  // cells per axis
constexpr int64_t kMaxColumns = 400;  // (x, y) columns a query may scan before the KD-tree takes it
constexpr double kInf = std::numeric_limits<double>::infinity();

struct Grid {
  double lo[3] = {0, 0, 0}, hi[3] = {0, 0, 0};  // the support's bounding box
  double h = 1;
  int64_t dim[3] = {1, 1, 1};
  std::vector<float> xyz;       // (n, 3) points in cell order
  std::vector<int64_t> ids;     // (n,) their index within the cloud
  std::vector<int64_t> cells;   // (X * Y * Z + 1,) first point of each cell, if not too many
  std::vector<int64_t> cols;    // else (X * Y + 1,) first point of each (x, y) column, if not too many
  std::vector<int64_t> hkey;    // else a hash table: occupied column -> [first, end) point
  std::vector<int64_t> hrange;
  uint64_t mask = 0;
  int shift = 63;
  std::vector<int32_t> zcell;   // (n,) z cell of each point
  double radius = 0;            // typical k-th neighbour distance (fitted_grid)

  // Points [p0, p1) of cells (x, y, z0..z1), x and y inside the grid; a short column is
  // returned whole (scanning a few extra points is cheaper than finding where z0..z1 lie).
  void column(int64_t x, int64_t y, int64_t z0, int64_t z1, int64_t& p0, int64_t& p1) const {
    const int64_t c = x * dim[1] + y;
    if (!cells.empty()) {  // exact: no extra points, no search
      p0 = cells[c * dim[2] + z0], p1 = cells[c * dim[2] + z1 + 1];
      return;
    }
    if (!cols.empty()) {
      p0 = cols[c], p1 = cols[c + 1];
    } else {  // open addressing, linear probing
      p0 = p1 = 0;
      for (uint64_t slot = hash(c);; slot = (slot + 1) & mask) {
        if (hkey[slot] == c) {
          p0 = hrange[2 * slot], p1 = hrange[2 * slot + 1];
          break;
        }
        if (hkey[slot] < 0) return;
      }
    }
    if (p1 - p0 > 16) {
      const int32_t* zb = zcell.data();
      p0 = std::lower_bound(zb + p0, zb + p1, int32_t(z0)) - zb;
      p1 = std::upper_bound(zb + p0, zb + p1, int32_t(z1)) - zb;
    }
  }

  uint64_t hash(int64_t c) const { return (uint64_t(c) * 0x9E3779B97F4A7C15ull) >> shift; }

  int64_t cell(double v, int a) const {  // unclamped cell coordinate, kept far from overflow
    double c = std::floor((v - lo[a]) / h);
    return int64_t(std::max(-4.0 * kMaxCells, std::min(c, 8.0 * kMaxCells)));
  }
  int64_t key(int64_t x, int64_t y, int64_t z) const { return (x * dim[1] + y) * dim[2] + z; }
  int64_t clamped_key(const float* p) const {
    int64_t c[3];
    for (int a = 0; a < 3; ++a) c[a] = std::max<int64_t>(0, std::min(cell(p[a], a), dim[a] - 1));
    return key(c[0], c[1], c[2]);
  }
};

// Sort `n` points (rows of `pts`) into `g` with cell edge `h` over the box [lo, hi]: a
// counting sort by cell (or by column, then by z within each column) where a dense table
// fits, else a comparison sort of the keys and a hash table of the occupied columns.
void build(Grid& g, const float* pts, int64_t n, const double* lo, const double* hi, double h) {
  double extent = 0;
  for (int a = 0; a < 3; ++a) extent = std::max(extent, hi[a] - lo[a]);
  g.h = std::max(h, extent / double(kMaxCells - 1));
  if (!(g.h > 0)) g.h = 1;
  for (int a = 0; a < 3; ++a) {
    g.lo[a] = lo[a], g.hi[a] = hi[a];
    g.dim[a] = std::min<int64_t>(kMaxCells, int64_t((hi[a] - lo[a]) / g.h) + 1);
  }
  std::vector<int64_t> key(n);
  for (int64_t i = 0; i < n; ++i) key[i] = g.clamped_key(pts + 3 * i);
  const int64_t columns = g.dim[0] * g.dim[1], dense = 16 * n + 4096;
  std::vector<int64_t> order(n);  // point indices in (x, y, z) cell order, ties by index
  g.cells.clear(), g.cols.clear(), g.hkey.clear(), g.hrange.clear();
  if (columns <= dense && columns * g.dim[2] <= dense) {
    g.cells.assign(columns * g.dim[2] + 1, 0);
    for (int64_t i = 0; i < n; ++i) ++g.cells[key[i] + 1];
    for (int64_t c = 0; c + 1 < int64_t(g.cells.size()); ++c) g.cells[c + 1] += g.cells[c];
    std::vector<int64_t> fill(g.cells.begin(), g.cells.end() - 1);
    for (int64_t i = 0; i < n; ++i) order[fill[key[i]]++] = i;
  } else if (columns <= dense) {
    g.cols.assign(columns + 1, 0);
    for (int64_t i = 0; i < n; ++i) ++g.cols[key[i] / g.dim[2] + 1];
    for (int64_t c = 0; c < columns; ++c) g.cols[c + 1] += g.cols[c];
    std::vector<int64_t> fill(g.cols.begin(), g.cols.end() - 1);
    for (int64_t i = 0; i < n; ++i) order[fill[key[i] / g.dim[2]]++] = i;
    for (int64_t c = 0; c < columns; ++c)  // by z within a column (ties keep index order)
      if (g.cols[c + 1] - g.cols[c] > 1)
        std::stable_sort(order.begin() + g.cols[c], order.begin() + g.cols[c + 1], [&](int64_t a, int64_t b) { return key[a] < key[b]; });
  } else {
    for (int64_t i = 0; i < n; ++i) order[i] = i;
    std::sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return key[a] < key[b] || (key[a] == key[b] && a < b); });
    int64_t occupied = 0;
    for (int64_t i = 0; i < n; ++i) occupied += i == 0 || key[order[i]] / g.dim[2] != key[order[i - 1]] / g.dim[2];
    int bits = 1;
    while ((int64_t(1) << bits) < 2 * occupied) ++bits;
    g.mask = (uint64_t(1) << bits) - 1;
    g.shift = 64 - bits;
    g.hkey.assign(g.mask + 1, -1);
    g.hrange.assign(2 * (g.mask + 1), 0);
    for (int64_t i = 0; i < n;) {
      const int64_t c = key[order[i]] / g.dim[2];
      int64_t e = i + 1;
      while (e < n && key[order[e]] / g.dim[2] == c) ++e;
      uint64_t slot = g.hash(c);
      while (g.hkey[slot] >= 0) slot = (slot + 1) & g.mask;
      g.hkey[slot] = c, g.hrange[2 * slot] = i, g.hrange[2 * slot + 1] = e;
      i = e;
    }
  }
  g.xyz.resize(3 * n);
  g.zcell.resize(n);
  for (int64_t i = 0; i < n; ++i) {
    const float* p = pts + 3 * order[i];
    g.xyz[3 * i] = p[0], g.xyz[3 * i + 1] = p[1], g.xyz[3 * i + 2] = p[2];
    g.zcell[i] = int32_t(key[order[i]] % g.dim[2]);
  }
  g.ids = std::move(order);
}

// Searches queries one after the other. A query scans the cells of the box q +- R and keeps
// the points within R; with at least k of them its k nearest are among them (every point
// within R lies in the box). R starts from the k-th distance of the query before (queries
// come in cell order: neighbours have similar k-th distances) and grows until k are found.
class Searcher {
 public:
  Searcher(const Grid& g, int64_t max_pass, double radius) : g_(g), max_pass_(max_pass), radius_(radius) {}

  // The kk nearest support points of q, ascending: positions in the grid's order and squared
  // distances (float; ties broken by position). False if q did not settle within max_pass scans.
  bool query(const float* q, int64_t kk, int64_t* pos, float* d2) {
    // the largest radius whose box stays within kMaxColumns columns, wherever q lies in its cell
    const double widest = (std::floor(std::sqrt(double(kMaxColumns))) - 1) / 2 * g_.h;
    double radius = std::max(std::min(radius_, widest), 1e-6 * g_.h);
    for (int64_t pass = 0; pass < max_pass_; ++pass) {
      const Box box = scan_box(q, radius);
      if (box == Box::kTooBig) return false;  // a far outlier of an uneven cloud: the KD-tree's job
      if (n_ >= kk) {
        // (distance^2 bits, position): usually a few dozen
        if (n_ > 2 * kk) std::nth_element(buf_.begin(), buf_.begin() + kk, buf_.begin() + n_);
        std::sort(buf_.begin(), buf_.begin() + std::min(n_, 2 * kk));
        for (int64_t j = 0; j < kk; ++j) {
          const uint32_t bits = uint32_t(buf_[j] >> 32);
          std::memcpy(&d2[j], &bits, sizeof(float));
          pos[j] = int64_t(buf_[j] & 0xffffffffu);
        }
        radius_ = std::max(1.1 * std::sqrt(double(d2[kk - 1])), 1e-30);
        return true;
      }
      if (box == Box::kWhole) return false;  // never: kk <= the cloud's points
      radius *= std::min(4.0, std::max(1.25, 1.1 * std::sqrt(double(kk) / double(std::max<int64_t>(n_, 1)))));
    }
    return false;
  }

 private:
  const Grid& g_;
  int64_t max_pass_;
  double radius_;
  std::vector<uint64_t> buf_;  // (distance^2 float bits << 32) | position, points within R
  int64_t n_ = 0;

  enum class Box { kPart, kWhole, kTooBig };

  // Keep every point within `radius` of q from the cells meeting the box q +- radius. Returns
  // whether the box holds the whole grid, or (scanning nothing) spans more than kMaxColumns.
  Box scan_box(const float* q, double radius) {
    int64_t lo[3], hi[3];
    bool whole = true;
    for (int a = 0; a < 3; ++a) {
      lo[a] = std::max<int64_t>(g_.cell(q[a] - radius, a), 0);
      hi[a] = std::min(g_.cell(q[a] + radius, a), g_.dim[a] - 1);
      whole = whole && lo[a] == 0 && hi[a] == g_.dim[a] - 1;
    }
    if (!whole && (hi[0] - lo[0] + 1) * (hi[1] - lo[1] + 1) > kMaxColumns) return Box::kTooBig;
    // every point when the box is the whole grid (R may be smaller than the k-th distance)
    const float r2 = whole ? std::numeric_limits<float>::infinity() : float(radius * radius);
    n_ = 0;
    for (int64_t x = lo[0]; x <= hi[0]; ++x)
      for (int64_t y = lo[1]; y <= hi[1]; ++y) {
        int64_t p0, p1;
        g_.column(x, y, lo[2], hi[2], p0, p1);
        if (int64_t(buf_.size()) < n_ + (p1 - p0)) buf_.resize(2 * (n_ + (p1 - p0)) + 64);
        const float* p = g_.xyz.data() + 3 * p0;
        uint64_t* out = buf_.data();
        int64_t n = n_;
        for (int64_t i = p0; i < p1; ++i, p += 3) {
          const float dx = p[0] - q[0], dy = p[1] - q[1], dz = p[2] - q[2];
          const float d = dx * dx + dy * dy + dz * dz;
          uint32_t bits;
          std::memcpy(&bits, &d, sizeof(float));
          out[n] = (uint64_t(bits) << 32) | uint64_t(i);
          n += d <= r2;
        }
        n_ = n;
      }
    return whole ? Box::kWhole : Box::kPart;
  }
};

void bounds(const float* pts, int64_t n, double* lo, double* hi) {
  for (int a = 0; a < 3; ++a) lo[a] = kInf, hi[a] = -kInf;
  for (int64_t i = 0; i < n; ++i)
    for (int a = 0; a < 3; ++a) lo[a] = std::min(lo[a], double(pts[3 * i + a])), hi[a] = std::max(hi[a], double(pts[3 * i + a]));
}

// A grid over the support whose cell edge is `scale` times R, the median k-th neighbour
// distance of 8 to 32 sample queries. R is measured by brute force on every (n / S)-th support
// point, S = max(4n / k, 4096): the k * S / n-th distance in the thinned cloud estimates the
// k-th in the whole one, whatever the cloud's shape (volume, surface, line).
void fitted_grid(Grid& g, const float* sup, int64_t ns, const float* qry, int64_t mq, int64_t k, double scale) {
  double lo[3], hi[3];
  bounds(sup, ns, lo, hi);
  const int64_t stride = std::max<int64_t>(1, ns / std::max<int64_t>(4 * ns / k, 4096));
  const int64_t thin = (ns + stride - 1) / stride;
  const int64_t kth_thin = std::max<int64_t>(1, std::min(thin, (k + stride - 1) / stride));
  const int64_t samples = std::min<int64_t>(mq, std::max<int64_t>(8, std::min<int64_t>(32, ns / 64)));
  std::vector<float> d(thin), kth(samples);
  for (int64_t s = 0; s < samples; ++s) {
    const float* q = qry + 3 * ((s * mq) / samples);
    for (int64_t j = 0; j < thin; ++j) {
      const float* p = sup + 3 * j * stride;
      const float dx = p[0] - q[0], dy = p[1] - q[1], dz = p[2] - q[2];
      d[j] = dx * dx + dy * dy + dz * dz;
    }
    std::nth_element(d.begin(), d.begin() + (kth_thin - 1), d.end());
    kth[s] = std::sqrt(d[kth_thin - 1]);
  }
  std::nth_element(kth.begin(), kth.begin() + samples / 2, kth.end());
  double radius = kth[samples / 2];
  double big = 0;
  for (int a = 0; a < 3; ++a) big = std::max(big, hi[a] - lo[a]);
  if (!(radius > 0)) radius = big > 0 ? big / std::cbrt(double(ns)) : 1;  // mostly duplicates
  build(g, sup, ns, lo, hi, scale * radius);
  g.radius = radius;
}

// fn(a, e) over chunks of [0, n) taken in turn by `threads` threads: a thread slowed by
// another process (or by a thread pool still spinning) takes fewer chunks.
template <class F>
void parallel_for(int64_t n, int64_t threads, F fn) {
  threads = std::max<int64_t>(1, std::min(threads, n));
  if (threads == 1) return fn(0, n);
  const int64_t chunk = std::max<int64_t>(1, n / (16 * threads));
  std::atomic<int64_t> next{0};
  auto work = [&]() {
    for (int64_t a; (a = next.fetch_add(chunk)) < n;) fn(a, std::min(n, a + chunk));
  };
  std::vector<std::thread> pool;
  for (int64_t t = 1; t < threads; ++t) pool.emplace_back(work);
  work();
  for (auto& th : pool) th.join();
}

// Queries [a, b) of one cloud (positions in `qorder`) against grid g.
void search_rows(const Grid& g, const float* qry, const int64_t* qorder, int64_t a, int64_t b, int64_t k, int64_t kk,
                 int64_t s_base, int64_t q_base, int64_t max_pass, int64_t* out_idx, float* out_dist, int8_t* unsettled) {
  std::vector<float> d2(kk);
  std::vector<int64_t> pos(kk);
  Searcher searcher(g, max_pass, g.radius);
  for (int64_t j = a; j < b; ++j) {
    const int64_t row = qorder ? qorder[j] : j;
    const float* q = qry + 3 * row;
    const bool ok = searcher.query(q, kk, pos.data(), d2.data());
    int64_t* oi = out_idx + (q_base + row) * k;
    float* od = out_dist + (q_base + row) * k;
    unsettled[q_base + row] = ok ? 0 : 1;
    for (int64_t c = 0; c < k; ++c) {
      const bool has = ok && c < kk;
      const float* p = has ? g.xyz.data() + 3 * pos[c] : q;
      const double dx = double(p[0]) - q[0], dy = double(p[1]) - q[1], dz = double(p[2]) - q[2];
      oi[c] = has ? s_base + g.ids[pos[c]] : -1;
      od[c] = has ? float(std::sqrt(dx * dx + dy * dy + dz * dz)) : std::numeric_limits<float>::infinity();
    }
  }
}

// Query order by cell, so consecutive queries scan the same cells.
std::vector<int64_t> cell_order(const Grid& g, const float* qry, int64_t m) {
  std::vector<std::pair<int64_t, int64_t>> kv(m);
  for (int64_t i = 0; i < m; ++i) kv[i] = {g.clamped_key(qry + 3 * i), i};
  std::sort(kv.begin(), kv.end());
  std::vector<int64_t> order(m);
  for (int64_t i = 0; i < m; ++i) order[i] = kv[i].second;
  return order;
}

}  // namespace

extern "C" {

// kNN of every query row among the support rows of its own cloud.
//   sup (N, 3), qry (M, 3): float32, C-contiguous; s_end, q_end (B,): cumulative cloud ends.
//   same != 0: qry is sup (self-query). out_idx (M, k) int64 global support rows (-1 where a
//   cloud has fewer than k points), out_dist (M, k) float32, unsettled (M,) int8.
// Returns 0.
int sf_grid_knn(const float* sup, const float* qry, const int64_t* s_end, const int64_t* q_end, int64_t n_clouds,
                int64_t k, int64_t same, int64_t max_pass, double scale, int64_t threads, int64_t* out_idx, float* out_dist,
                int8_t* unsettled) {
  auto one_cloud = [&](int64_t b, int64_t inner_threads) {
    const int64_t s0 = b ? s_end[b - 1] : 0, ns = s_end[b] - s0;
    const int64_t q0 = b ? q_end[b - 1] : 0, mq = q_end[b] - q0;
    if (mq == 0) return;
    const int64_t kk = std::min(k, ns);
    const float* cq = qry + 3 * q0;
    Grid g;
    fitted_grid(g, sup + 3 * s0, ns, cq, mq, kk, scale);
    std::vector<int64_t> order;
    const int64_t* qorder = g.ids.data();
    if (!same) {
      order = cell_order(g, cq, mq);
      qorder = order.data();
    }
    parallel_for(mq, inner_threads, [&](int64_t a, int64_t e) {
      search_rows(g, cq, qorder, a, e, k, kk, s0, q0, max_pass, out_idx, out_dist, unsettled);
    });
    // Queries in sparse parts of an uneven cloud (far from a spinning sensor, outliers) try
    // grids 8 and 64 times coarser before the caller's KD-tree takes what is left.
    for (int level = 1; level <= 2; ++level) {
      std::vector<int64_t> rest;
      for (int64_t j = 0; j < mq; ++j)
        if (unsettled[q0 + qorder[j]]) rest.push_back(qorder[j]);
      if (rest.empty() || ns <= 4 * kk) break;
      Grid coarse;
      build(coarse, sup + 3 * s0, ns, g.lo, g.hi, g.h * (level == 1 ? 8 : 64));
      coarse.radius = coarse.h;
      parallel_for(int64_t(rest.size()), inner_threads, [&](int64_t a, int64_t e) {
        search_rows(coarse, cq, rest.data(), a, e, k, kk, s0, q0, max_pass, out_idx, out_dist, unsettled);
      });
    }
  };
  if (n_clouds == 1) {
    one_cloud(0, threads);
  } else {
    parallel_for(n_clouds, threads, [&](int64_t a, int64_t e) {
      for (int64_t b = a; b < e; ++b) one_cloud(b, 1);
    });
  }
  return 0;
}

}  // extern "C"
