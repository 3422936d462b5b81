// Where fpsample's bucket KD-line tree build (fpsample 1.0, QuickFPS) moves one point: its
// samplers read `start_idx` after reordering the points into their tree, so sciformer's FPS
// asks for the position its start point lands on (sciformer/geometry/fps.py, which also
// holds the NumPy version this one equals, and checks the first sample it gets back).
//
// Each node splits along its widest bounding-box axis (the first such) at the float32 mean
// of that coordinate, summed in the node's current order, with a Hoare partition; leaves lie
// at depth `height` or hold one point. Only the nodes on the start point's path are
// replayed (about 2n work). Compiled into the grid kNN library (setup.py): no FMA
// contraction and no reassociation, so the float32 sums are the tree build's.

#include <cstdint>
#include <vector>

extern "C" {

// pts (n, D) float32 C-contiguous; 0 <= start < n. Returns start's position after the build.
int64_t sf_kdline_position(const float* pts, int64_t n, int64_t D, int64_t height, int64_t start) {
  std::vector<int64_t> seg(n);  // original ids in the current node's order
  for (int64_t i = 0; i < n; ++i) seg[i] = i;
  std::vector<int64_t> wrong_left(n + 1), wrong_right(n + 1);  // one slot past: written, not counted
  int64_t lo = 0, hi = n;  // the node: seg[lo, hi)
  for (int64_t level = 0; level < height && hi - lo > 1; ++level) {
    const int64_t count = hi - lo;
    int64_t axis = 0;
    float widest = -1;
    for (int64_t a = 0; a < D; ++a) {
      float mn = pts[seg[lo] * D + a], mx = mn;
      for (int64_t i = lo + 1; i < hi; ++i) {
        const float v = pts[seg[i] * D + a];
        mn = v < mn ? v : mn, mx = v > mx ? v : mx;
      }
      if (mx - mn > widest) widest = mx - mn, axis = a;
    }
    float sum = 0;
    for (int64_t i = lo; i < hi; ++i) sum += pts[seg[i] * D + axis];
    const float split = sum / float(count);
    // positions of the points on the wrong side: right-side ones from the left, left-side
    // ones from the right (compacted without branches: the sides are unpredictable)
    int64_t n_wrong_left = 0, n_wrong_right = 0;
    for (int64_t i = lo; i < hi; ++i) {
      const bool left = pts[seg[i] * D + axis] < split;
      wrong_left[n_wrong_left] = i, n_wrong_left += !left;
    }
    for (int64_t i = hi - 1; i >= lo; --i) {
      const bool left = pts[seg[i] * D + axis] < split;
      wrong_right[n_wrong_right] = i, n_wrong_right += left;
    }
    const int64_t n_left = n_wrong_right;
    int64_t cut;
    if (n_left == 0) {
      cut = 1;
    } else if (n_left == count) {
      cut = count - 1;
    } else {  // Hoare: the t-th wrong point from the left swaps with the t-th from the right
      cut = n_left;
      for (int64_t t = 0; t < n_wrong_left && t < n_wrong_right && wrong_left[t] < wrong_right[t]; ++t) {
        const int64_t x = seg[wrong_left[t]];
        seg[wrong_left[t]] = seg[wrong_right[t]], seg[wrong_right[t]] = x;
      }
    }
    int64_t at = lo;
    while (seg[at] != start) ++at;
    if (at - lo < cut) {
      hi = lo + cut;
    } else {
      lo += cut;
    }
  }
  int64_t at = lo;
  while (seg[at] != start) ++at;
  return at;
}

}  // extern "C"
