// A window's geometry for the tests of window operations: h x w images of c
// channels, a k x k kernel every `stride` values over `pad` zeros on each
// side, and the output size those give.
#ifndef MONSOON_TESTS_WINDOW_GEOMETRY_H_
#define MONSOON_TESTS_WINDOW_GEOMETRY_H_

#include "worker/compute_backend.h"

namespace monsoon::testutil {

inline worker::WindowGeometry Window(int h, int w, int c, int k, int stride,
                                     int pad) {
  worker::WindowGeometry g;
  g.height = h;
  g.width = w;
  g.channels = c;
  g.kernel = k;
  g.stride = stride;
  g.padding = pad;
  g.out_height = (h + 2 * pad - k) / stride + 1;
  g.out_width = (w + 2 * pad - k) / stride + 1;
  return g;
}

}  // namespace monsoon::testutil

#endif  // MONSOON_TESTS_WINDOW_GEOMETRY_H_
