// The per-query search of the grid kNN kernel (_grid_knn.cpp): a box of cells around the
// query, widened until k points lie within its radius; exact ranking of near-ties in double.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <utility>
#include <vector>

#include "_grid_knn_grid.h"

namespace sciformer_grid {

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
    double outside = 0;  // squared distance from q to the box of the bulk of the cloud
    for (int a = 0; a < 3; ++a) {
      const double below = g_.lo[a] - q[a], above = q[a] - g_.hi[a];  // the bulk's box, not the cells'

      outside += std::max({below, above, 0.0}) * std::max({below, above, 0.0});
    }
    // far outside the bulk, a box around q would take in much of the cloud: the KD-tree's job
    if (outside > g_.far * g_.far) return false;
    if (duplicates(q, kk, pos, d2)) return true;
    // the largest radius whose box stays within kMaxColumns columns, wherever q lies in its cell
    const double widest = (std::floor(std::sqrt(double(kMaxColumns))) - 1) / 2 * g_.h;
    double radius = std::max(std::min(radius_, widest), 1e-6 * g_.h);
    for (int64_t pass = 0; pass < max_pass_; ++pass) {
      const Box box = scan_box(q, radius);
      if (box == Box::kTooBig) return false;  // a far outlier of an uneven cloud: the KD-tree's job
      if (n_ >= kk) {
        const double kth2 = select(q, kk, pos, d2);  // exact (double) squared k-th distance
        if (box == Box::kWhole || kth2 <= radius * radius) {  // every point closer lies in the box
          radius_ = std::max(1.1 * std::sqrt(kth2), 0.25 * g_.radius);  // k = 1: kth is 0
          return true;
        }
        radius = std::max(std::sqrt(kth2), 1.25 * radius);  // kept by the float slack only
        continue;
      }
      if (box == Box::kWhole) return false;  // never: kk <= the cloud's points
      radius *= std::min(4.0, std::max(1.25, 1.1 * std::sqrt(double(kk) / double(std::max<int64_t>(n_, 1)))));
    }
    return false;
  }

  // The kk nearest among all support points, for a query no grid serves (a far outlier):
  // float squared distances against the running kk-th smallest tau (a max-heap, started
  // from the kk-th of the run of 64 points whose box is nearest, an upper bound), keeping
  // every point within a few ulps of tau when it came; runs whose box lies farther (bounds
  // rounded as the distances are: never above a point's) or with no point that near are
  // passed over. Those still within the ulps of the final tau are ranked as in a box search
  // (select), so the answer is as exact. Needs the grid's block_boxes(). False: not settled.
  bool brute(const float* q, int64_t kk, int64_t* pos, float* d2) {
    const int64_t n = int64_t(g_.ids.size()), nb = (n + 63) / 64;
    const float* xyz = g_.xyz.data();
    const float inf = std::numeric_limits<float>::infinity(), slack = std::numeric_limits<float>::denorm_min() * 8;
    float block[64];
    // a lower bound of the squared distance from q to each run's points: the gaps to its
    // box, squared and summed as dist2 does (rounding is monotone)
    bound_.resize(nb);
    const float* bx = g_.boxes.data();
    float* bound = bound_.data();
    for (int64_t j = 0; j < nb; ++j) {
      float gap[3];
      for (int a = 0; a < 3; ++a) gap[a] = std::max(std::max(bx[a * nb + j] - q[a], q[a] - bx[(3 + a) * nb + j]), 0.f);
      bound[j] = gap[0] * gap[0] + gap[1] * gap[1] + gap[2] * gap[2];
    }
    // the kk-th smallest distance of the nearest run's points bounds the kk-th of all points
    // from above: starting from it, few points enter the heap
    const int64_t nearest = std::min_element(bound, bound + nb) - bound;
    float tau = inf;
    top_.clear();
    for (int64_t i = 64 * nearest; i < std::min(n, 64 * nearest + 64); ++i) {
      const float d = dist2(xyz + 3 * i, q);
      if (int64_t(top_.size()) < kk || d < top_.front()) keep_smallest(d, kk);
    }
    if (int64_t(top_.size()) == kk) tau = top_.front();
    float high = tau * (1 + 1e-5f) + slack;  // tau plus a few ulps (inf: every point)
    // the runs that may hold a point within it; the 8 nearest first, so tau falls quickly and
    // most of the others are passed over
    runs_.resize(nb);
    int64_t listed = 0;
    for (int64_t j = 0; j < nb; ++j) {
      runs_[listed] = (uint64_t(float_bits(bound[j])) << 32) | uint64_t(j);
      listed += bound[j] <= high;
    }
    std::partial_sort(runs_.begin(), runs_.begin() + std::min<int64_t>(8, listed), runs_.begin() + listed);
    top_.clear();
    n_ = 0;
    int64_t limit = 4 * kk + 256;  // compact buf_ past this many (doubled after: linear in all)
    for (int64_t r = 0; r < listed; ++r) {
      const uint64_t run = runs_[r];
      if (bound[run & 0xffffffffu] > high) continue;  // every point of the run is farther
      const int64_t s = 64 * int64_t(run & 0xffffffffu), e = std::min(n, s + 64);
      int hits = 0;
      for (int64_t i = s; i < e; ++i) {
        const float d = dist2(xyz + 3 * i, q);
        block[i - s] = d;
        hits += d <= high;
      }
      if (hits == 0) continue;
      for (int64_t i = s; i < e; ++i) {
        const float d = block[i - s];
        if (!(d <= high)) continue;
        if (int64_t(buf_.size()) <= n_) buf_.resize(2 * n_ + 64);
        buf_[n_++] = (uint64_t(float_bits(d)) << 32) | uint64_t(i);
        // before the heap is full, ties with the bound enter (kk points lie within it)
        if (!(int64_t(top_.size()) < kk ? d <= tau : d < tau)) continue;
        keep_smallest(d, kk);
        if (int64_t(top_.size()) == kk) tau = top_.front(), high = tau * (1 + 1e-5f) + slack;
      }
      if (n_ > limit) compact(high), limit = std::max(limit, 2 * n_);  // drop what a smaller tau excludes
    }
    compact(high);
    if (n_ < kk) return false;  // never for finite points (distances may be inf: all kept)
    select(q, kk, pos, d2);
    return true;
  }

 private:
  // The kk nearest of the n_ candidates in buf_: ranked by float32 squared distance, then the
  // candidates tied with the kk-th at float32 resolution (a few ulps) ranked again in double,
  // ties by position, so the answer is exact and the same for any order of the input.
  double select(const float* q, int64_t kk, int64_t* pos, float* d2) {
    auto dist_of = [](uint64_t key) {
      float d;
      const uint32_t bits = uint32_t(key >> 32);
      std::memcpy(&d, &bits, sizeof(float));
      return d;
    };
    if (n_ <= 64) {  // the usual few candidates: placed by rank (keys are distinct), no branches
      uint64_t* b = buf_.data();
      uint64_t sorted[64];
      for (int64_t i = 0; i < n_; ++i) {
        int64_t rank = 0;
        for (int64_t j = 0; j < n_; ++j) rank += b[j] < b[i];
        sorted[rank] = b[i];
      }
      std::copy_n(sorted, n_, b);
    } else {
      std::nth_element(buf_.begin(), buf_.begin() + (kk - 1), buf_.begin() + n_);
      std::sort(buf_.begin(), buf_.begin() + kk);  // the kk smallest, ascending
    }
    const float kth = dist_of(buf_[kk - 1]), slack = std::numeric_limits<float>::denorm_min() * 4;
    const float low = kth * (1 - 1e-6f) - slack, high = kth * (1 + 1e-6f) + slack;
    int64_t first = kk - 1;  // the tie group: buf_[first, kk) and every later candidate <= high
    while (first > 0 && dist_of(buf_[first - 1]) >= low) --first;
    exact_.clear();
    auto add = [&](uint64_t key) {
      const int64_t p = int64_t(key & 0xffffffffu);
      const float* s = g_.xyz.data() + 3 * p;
      const double dx = double(s[0]) - q[0], dy = double(s[1]) - q[1], dz = double(s[2]) - q[2];
      exact_.emplace_back(dx * dx + dy * dy + dz * dz, p);
    };
    for (int64_t j = first; j < n_; ++j)
      if (j < kk || dist_of(buf_[j]) <= high) add(buf_[j]);
    std::sort(exact_.begin(), exact_.end());
    for (int64_t j = 0; j < kk; ++j) {
      if (j < first) {
        d2[j] = dist_of(buf_[j]), pos[j] = int64_t(buf_[j] & 0xffffffffu);
      } else {
        d2[j] = float(exact_[j - first].first), pos[j] = exact_[j - first].second;
      }
    }
    return exact_[kk - 1 - first].first;
  }

  // Many copies of q (no-data returns stored at one spot): kk points at distance 0 in q's own
  // cell answer it without scanning the rest (a cell may hold tens of thousands of them).
  bool duplicates(const float* q, int64_t kk, int64_t* pos, float* d2) {
    int64_t c[3];
    for (int a = 0; a < 3; ++a) {
      c[a] = g_.cell(q[a], a);
      if (c[a] < 0 || c[a] >= g_.dim[a]) return false;
    }
    int64_t p0 = 0, p1 = 0;
    g_.each_column(c[0], c[0], c[1], c[1], c[2], c[2], [&](int64_t a, int64_t e) { return p0 = a, p1 = e, true; });
    if (p1 - p0 < 64) return false;  // the usual case: the box scan is as cheap
    int64_t found = 0;
    for (int64_t i = p0; i < p1 && found < kk; ++i) {
      const float* s = g_.xyz.data() + 3 * i;
      if (s[0] == q[0] && s[1] == q[1] && s[2] == q[2]) pos[found] = i, d2[found++] = 0;
    }
    return found == kk;
  }

  const Grid& g_;
  std::vector<std::pair<double, int64_t>> exact_;
  int64_t max_pass_;
  double radius_;
  // Put d among the kk smallest distances of top_ (a max-heap; brute): pushed while fewer
  // than kk, else in place of the largest (the caller checked d is smaller).
  void keep_smallest(float d, int64_t kk) {
    if (int64_t(top_.size()) == kk) {
      std::pop_heap(top_.begin(), top_.end());
      top_.back() = d;
    } else {
      top_.push_back(d);
    }
    std::push_heap(top_.begin(), top_.end());
  }

  // Keep the candidates of buf_ within `high` (brute).
  void compact(float high) {
    int64_t kept = 0;
    for (int64_t j = 0; j < n_; ++j) {
      float d;
      const uint32_t bits = uint32_t(buf_[j] >> 32);
      std::memcpy(&d, &bits, sizeof(float));
      if (d <= high) buf_[kept++] = buf_[j];
    }
    n_ = kept;
  }

  std::vector<float> top_;  // brute: the kk smallest squared distances so far (max-heap)
  std::vector<float> bound_;  // brute: lower bound of the squared distances of each run of 64 points
  std::vector<uint64_t> runs_;  // brute: (bound bits << 32) | run, of the runs to scan
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
    n_ = 0;
    if (lo[0] > hi[0] || lo[1] > hi[1] || lo[2] > hi[2]) return Box::kPart;  // the box misses the grid
    if (!whole && (hi[0] - lo[0] + 1) * (hi[1] - lo[1] + 1) > kMaxColumns) return Box::kTooBig;
    // every point when the box is the whole grid (R may be smaller than the k-th distance)
    // a few ulps of slack: a point just inside r whose float32 square rounds up is kept too
    const float r2 = whole ? std::numeric_limits<float>::infinity() : float(radius * radius) * (1 + 1e-6f);
    int64_t scanned = 0;
    const bool small = int64_t(g_.ids.size()) <= kMaxScan;  // a small cloud may be scanned whole
    const bool within = g_.each_column(lo[0], hi[0], lo[1], hi[1], lo[2], hi[2], [&](int64_t p0, int64_t p1) {
      if ((scanned += p1 - p0) > kMaxScan && !small) return false;  // a box over much of a large cloud
      if (int64_t(buf_.size()) < n_ + (p1 - p0)) buf_.resize(2 * (n_ + (p1 - p0)) + 64);
      const float* p = g_.xyz.data() + 3 * p0;
      uint64_t* out = buf_.data();
      int64_t n = n_;
      for (int64_t i = p0; i < p1; ++i, p += 3) {
        const float d = dist2(p, q);
        out[n] = (uint64_t(float_bits(d)) << 32) | uint64_t(i);
        n += d <= r2;
      }
      n_ = n;
      return true;
    });
    if (!within) {
      n_ = 0;
      return Box::kTooBig;
    }
    return whole ? Box::kWhole : Box::kPart;
  }
};

}  // namespace sciformer_grid
