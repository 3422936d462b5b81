// Exact k-nearest-neighbour search of 3-D points on a uniform grid of cells, cloud by cloud
// over a packed batch. Loaded with ctypes by sciformer/geometry/grid_knn.py (plain C ABI, no
// Python API; ctypes releases the GIL during the call).
//
// Per cloud: the cell edge is R (scale 1), R the median k-th neighbour distance of a few
// sample points (brute force on a thinned cloud); the grid spans the bulk of the cloud. The
// points are sorted by cell (x-major, z fastest) with a dense table of cells, or of (x, y)
// columns, or a hash of occupied 4 x 4 blocks of columns where the box is too sparse for
// either (_grid_knn_grid.h). Queries, taken in cell order, scan the cells of the box q +- r
// (r from the query before) and keep the points within r; with k of them the answer is
// exact, else r grows (_grid_knn_search.h). Queries far outside the bulk, or whose box would
// span too many columns or points, are compared with every point when they are few (64, or
// 2^24 distances in all; runs of 64 points whose box lies beyond the k-th distance found so
// far are passed over), else try grids 8 and 64 times coarser first; more than that are
// flagged in `unsettled` for the caller's KD-tree. Ranking is in float32 squared distances
// (no fused multiply-adds: the same on every CPU), near-ties ranked again in double;
// distances reported from double. The hot functions are compiled for AVX2 too (SF_CLONES).
// A single cloud's grids (and their build's working arrays) stay with the calling thread for
// its next call, up to kKeepBytes: fresh memory costs a page fault per 4 KiB page.

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <exception>
#include <limits>
#include <mutex>
#include <new>
#include <system_error>
#include <thread>
#include <vector>

#include "../_kernels.h"
#include "_grid_knn_grid.h"
#include "_grid_knn_search.h"

namespace sciformer_grid {

constexpr int64_t kBruteWork = int64_t(1) << 24;  // distances the last queries may take by brute force
constexpr int64_t kKeepBytes = int64_t(32) << 20;  // grid memory a thread keeps between calls

// fn(a, e) over chunks [a, a + chunk) of [0, n), taken in turn by `threads` threads: a
// thread slowed by another process (or a thread pool still spinning) takes fewer chunks. The
// chunks do not depend on the thread count, so neither do the results (a search carries its
// radius from query to query within a chunk only).
template <class F>
void parallel_for(int64_t n, int64_t threads, int64_t chunk, F fn) {
  threads = std::max<int64_t>(1, std::min(threads, (n + chunk - 1) / chunk));
  std::atomic<int64_t> next{0};
  std::exception_ptr failed;  // the first error of any thread, raised after all have joined
  std::mutex lock;
  auto work = [&]() {
    try {
      for (int64_t a; (a = next.fetch_add(chunk)) < n;) fn(a, std::min(n, a + chunk));
    } catch (...) {
      std::lock_guard<std::mutex> hold(lock);
      if (!failed) failed = std::current_exception();
      next = n;
    }
  };
  std::vector<std::thread> pool;
  for (int64_t t = 1; t < threads; ++t) {
    try {
      pool.emplace_back(work);
    } catch (...) {  // std::system_error, std::bad_alloc
      break;  // no thread to be had (a process or memory limit): the started ones and this one share the work
    }
  }
  work();
  for (auto& th : pool) th.join();
  if (failed) std::rethrow_exception(failed);
}

// A grid over the support whose cell edge is `scale` times R, the median k-th neighbour
// distance of 8 to 32 sample support points. R is measured by brute force on every
// (n / S)-th support point, S = max(4n / k, 4096): the k * S / n-th distance in the thinned
// cloud estimates the k-th in the whole one, whatever the cloud's shape (volume, surface,
// line). The grid spans the bulk of the cloud (0.1 to 99.9 % quantiles of the thinned
// points per axis): a stray point far away would otherwise stretch the cells over the whole
// cloud (a tail is cut where it reaches farther than the bulk is wide). Points outside lie in
// the border cells (cells are clamped), which keeps every search exact. Returns false where float32 squared distances would underflow (R < 1e-15).
enum class Fit { kGood, kUneven, kTooFine };

SF_CLONES Fit fitted_grid(Grid& g, const float* sup, int64_t ns, int64_t k, double scale, int64_t threads) {
  double lo[3], hi[3];
  bounds(sup, ns, lo, hi);
  const int64_t stride = std::max<int64_t>(1, ns / std::max<int64_t>(4 * ns / k, 4096));
  const int64_t thin = (ns + stride - 1) / stride;
  const int64_t kth_thin = std::max<int64_t>(1, std::min(thin, (k + stride - 1) / stride));
  const int64_t samples = std::min<int64_t>(ns, std::max<int64_t>(8, std::min<int64_t>(32, ns / 64)));
  std::vector<float> kth(samples);
  // samples from the thinned cloud, on the threads when that is worth starting one (about
  // 0.1 ms here): from 2^15 distances
  parallel_for(samples, samples * thin >= (int64_t(1) << 15) ? threads : 1, 1, [&](int64_t a, int64_t e) {
    std::vector<float> d(thin);
    for (int64_t s = a; s < e; ++s) {
      const float* q = sup + 3 * stride * ((s * thin) / samples);
      for (int64_t j = 0; j < thin; ++j) {
        d[j] = dist2(sup + 3 * j * stride, q);
      }
      const int64_t nth = std::min(kth_thin == 1 ? 1 : kth_thin - 1, thin - 1);  // k = 1: not itself
      std::nth_element(d.begin(), d.begin() + nth, d.end());
      kth[s] = std::sqrt(d[nth]);
    }
  });
  std::sort(kth.begin(), kth.end());
  double radius = kth[samples / 2];
  // k-th distances spread over more than 25x (density falling with the square of the range and
  // more, as around a spinning sensor): one cell size cannot serve them, the KD-tree can
  const bool even = samples < 16 || kth[samples / 10] <= 0 || kth[samples - 1 - samples / 10] <= 25 * kth[samples / 10];
  if (thin >= 1000) {  // the bulk's box
    std::vector<float> d(thin);
    const int64_t cut = thin / 1000;
    for (int a = 0; a < 3; ++a) {
      for (int64_t j = 0; j < thin; ++j) d[j] = sup[3 * j * stride + a];
      std::nth_element(d.begin(), d.begin() + cut, d.end());
      const double low = d[cut];
      std::nth_element(d.begin(), d.end() - 1 - cut, d.end());
      const double high = d[thin - 1 - cut], width = high - low;
      if (lo[a] < low - width) lo[a] = low - 0.01 * width;  // cut only tails longer than the bulk
      if (hi[a] > high + width) hi[a] = high + 0.01 * width;
    }
  }
  double big = 0;
  for (int a = 0; a < 3; ++a) big = std::max(big, hi[a] - lo[a]);
  if (!(radius > 0)) radius = big > 0 ? big / std::cbrt(double(ns)) : 1;  // mostly duplicates
  build(g, sup, ns, lo, hi, scale * radius);
  g.radius = radius;
  g.far = 4 * radius;
  return radius < 1e-15 ? Fit::kTooFine : even ? Fit::kGood : Fit::kUneven;
}

// Queries [a, b) of one cloud (rows `rows[j]`, or j without `rows`) against grid g; `own`:
// query j is the grid's own point j (a self-query in the grid's order, whose coordinates are
// read in order). `brute`: each query is compared with every point (the box search left it).
// Answers go to a buffer in query order first, then to their rows in one pass (rows in cell
// order lie scattered over the output: stores between searches would miss the cache).
SF_CLONES __attribute__((flatten)) void search_rows(const Grid& g, const float* qry, const int64_t* rows, bool own, bool brute, int64_t a, int64_t b,
                 int64_t k, int64_t kk, int64_t s_base, int64_t max_pass, int64_t* out_idx, float* out_dist,
                 int8_t* unsettled) {
  std::vector<float> d2(kk), bd((b - a) * k);
  std::vector<int64_t> pos(kk), bi((b - a) * k);
  Searcher searcher(g, max_pass, g.radius);
  for (int64_t j = a; j < b; ++j) {
    const float* q = own ? g.xyz.data() + 3 * j : qry + 3 * (rows ? rows[j] : j);
    const bool ok = brute ? searcher.brute(q, kk, pos.data(), d2.data()) : searcher.query(q, kk, pos.data(), d2.data());
    unsettled[rows ? rows[j] : j] = ok ? 0 : 1;
    int64_t* oi = bi.data() + (j - a) * k;
    float* od = bd.data() + (j - a) * k;
    for (int64_t c = 0; c < k; ++c) {
      const bool has = ok && c < kk;
      const float* p = has ? g.xyz.data() + 3 * pos[c] : q;
      const double dx = double(p[0]) - q[0], dy = double(p[1]) - q[1], dz = double(p[2]) - q[2];
      oi[c] = has ? s_base + g.ids[pos[c]] : -1;
      od[c] = has ? float(std::sqrt(dx * dx + dy * dy + dz * dz)) : std::numeric_limits<float>::infinity();
    }
    // ranked in float32 squared distances, reported from double: restore ascending order
    // where the two roundings disagree about near-ties (insertion: already nearly sorted)
    for (int64_t c = 1; c < k; ++c)
      for (int64_t i = c; i > 0 && od[i - 1] > od[i]; --i) std::swap(od[i - 1], od[i]), std::swap(oi[i - 1], oi[i]);
  }
  for (int64_t j = a; j < b; ++j) {
    const int64_t row = rows ? rows[j] : j;
    std::copy_n(bi.data() + (j - a) * k, k, out_idx + row * k);
    std::copy_n(bd.data() + (j - a) * k, k, out_dist + row * k);
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
}  // namespace sciformer_grid

using namespace sciformer_grid;

extern "C" {

// kNN of every query row among the support rows of its own cloud.
//   sup (N, 3), qry (M, 3): float32, C-contiguous; s_end, q_end (B,): cumulative cloud ends.
//   same != 0: qry is sup (self-query). out_idx (M, k) int64 global support rows (-1 where a
//   cloud has fewer than k points), out_dist (M, k) float32, unsettled (M,) int8: 0 done,
//   1 for the caller's search, 2 for the caller's search in double.
// Returns 0, or 2 when memory ran out, 1 on any other error (never throws into the caller).
int sf_grid_knn(const float* sup, const float* qry, const int64_t* s_end, const int64_t* q_end, int64_t n_clouds,
                int64_t k, int64_t same, int64_t max_pass, double scale, int64_t threads, int64_t* out_idx, float* out_dist,
                int8_t* unsettled) {
  // g, coarse: grids of an earlier cloud or call, rebuilt here (their memory reused)
  auto one_cloud = [&](int64_t b, int64_t inner_threads, Grid& g, Grid& coarse) {
    const int64_t s0 = b ? s_end[b - 1] : 0, ns = s_end[b] - s0;
    const int64_t q0 = b ? q_end[b - 1] : 0, mq = q_end[b] - q0;
    if (mq == 0) return;
    const int64_t kk = std::min(k, ns);
    const float* cq = qry + 3 * q0;
    const Fit fit = fitted_grid(g, sup + 3 * s0, ns, kk, scale, inner_threads);
    if (fit != Fit::kGood) {  // all to the KD-tree; in double where float32 squares underflow
      for (int64_t j = 0; j < mq; ++j) {
        unsettled[q0 + j] = fit == Fit::kTooFine ? 2 : 1;
        std::fill(out_idx + (q0 + j) * k, out_idx + (q0 + j + 1) * k, int64_t(-1));
        std::fill(out_dist + (q0 + j) * k, out_dist + (q0 + j + 1) * k, std::numeric_limits<float>::infinity());
      }
      return;
    }
    int64_t* oi = out_idx + q0 * k;  // this cloud's rows
    float* od = out_dist + q0 * k;
    int8_t* us = unsettled + q0;
    const int64_t* qorder = g.ids.data();  // a self-query walks the grid's order
    std::vector<int64_t> order;
    if (!same) {
      order = cell_order(g, cq, mq);
      qorder = order.data();
    }
    parallel_for(mq, inner_threads, kChunk, [&](int64_t a, int64_t e) {
      search_rows(g, cq, qorder, same != 0, false, a, e, k, kk, s0, max_pass, oi, od, us);
    });
    // Queries left (sparse parts of an uneven cloud, outliers) are compared with every point
    // (but the runs of points whose box lies too far) when few (cheaper than the KD-tree's
    // build), else try grids 8 and 64 times coarser first; what even those leave goes to
    // the caller's KD-tree.
    for (int level = 1; level <= 3; ++level) {
      std::vector<int64_t> rest;
      for (int64_t j = 0; j < mq; ++j)
        if (us[qorder[j]]) rest.push_back(qorder[j]);
      if (rest.empty()) break;
      const bool brute = int64_t(rest.size()) * ns <= kBruteWork || int64_t(rest.size()) <= 64;
      if (!brute && (level == 3 || ns <= 4 * kk)) break;
      const Grid* grid = &g;
      if (brute) {
        g.block_boxes();
      } else {
        build(coarse, sup + 3 * s0, ns, g.lo, g.hi, g.h * (level == 1 ? 8 : 64));
        coarse.radius = coarse.h;
        coarse.far = g.far;
        grid = &coarse;
      }
      parallel_for(int64_t(rest.size()), inner_threads, brute ? 8 : kChunk, [&](int64_t a, int64_t e) {
        search_rows(*grid, cq, rest.data(), false, brute, a, e, k, kk, s0, max_pass, oi, od, us);
      });
      if (brute) break;
    }
  };
  try {
    if (n_clouds == 1) {
      // kept by the calling thread for its next call: fresh memory costs a page fault per
      // 4 KiB
      thread_local Grid grid, coarse;
      struct Trim {  // on every exit: memory past kKeepBytes, or after an error, is not kept
        ~Trim() {
          if (std::uncaught_exceptions() > 0 || grid.bytes() + coarse.bytes() > kKeepBytes) grid = Grid(), coarse = Grid();
        }
      } trim;
      one_cloud(0, threads, grid, coarse);
    } else {
      parallel_for(n_clouds, threads, 1, [&](int64_t a, int64_t e) {
        Grid grid, coarse;  // reused over this thread's clouds
        for (int64_t b = a; b < e; ++b) one_cloud(b, 1, grid, coarse);
      });
    }
  } catch (const std::bad_alloc&) {
    return 2;
  } catch (...) {
    return 1;
  }
  return 0;
}

}  // extern "C"
