#include "worker/cpu_small_gemm.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/window_geometry.h"
#include "worker/compute_backend.h"

namespace monsoon::worker {
namespace {

// Small integers, so that every product and sum below is exact in float32
// whatever the order of the additions: the kernels must match the
// reference bit for bit.
std::vector<float> Integers(size_t n, uint64_t seed) {
  std::vector<float> values(n);
  for (size_t i = 0; i < n; ++i) {
    seed = seed * 6364136223846793005ULL + 1442695040888963407ULL;
    values[i] = static_cast<float>(static_cast<int>((seed >> 33) % 9) - 4);
  }
  return values;
}

// C = alpha * op(A) * op(B) + beta * C over doubles (exact here), with
// op(A) m x k and op(B) k x n; beta 0 ignores C.
std::vector<float> Reference(bool trans_a, bool trans_b, int m, int n, int k,
                             float alpha, const std::vector<float>& a,
                             const std::vector<float>& b, float beta,
                             std::vector<float> c) {
  for (int i = 0; i < m; ++i) {
    for (int j = 0; j < n; ++j) {
      double sum = 0;
      for (int p = 0; p < k; ++p) {
        const double x = trans_a ? a[static_cast<size_t>(p) * m + i]
                                 : a[static_cast<size_t>(i) * k + p];
        const double y = trans_b ? b[static_cast<size_t>(j) * k + p]
                                 : b[static_cast<size_t>(p) * n + j];
        sum += x * y;
      }
      float& out = c[static_cast<size_t>(i) * n + j];
      out = static_cast<float>(beta == 0 ? alpha * sum
                                         : alpha * sum + beta * double{out});
    }
  }
  return c;
}

// Both builds of the kernels: the widest this CPU has, and AVX2 alone.
constexpr SmallGemmUnits kUnits[] = {SmallGemmUnits::kWidest,
                                     SmallGemmUnits::kAvx2};
const char* UnitsName(SmallGemmUnits units) {
  return units == SmallGemmUnits::kWidest ? "widest" : "AVX2";
}

class CpuSmallGemmTest : public testing::Test {
 protected:
  void SetUp() override {
    if (!SmallGemmSupported()) {
      GTEST_SKIP() << "this CPU has no AVX2 and FMA, which the kernels need "
                      "(the CPU backend uses OpenBLAS for every product here)";
    }
  }
};

TEST_F(CpuSmallGemmTest, FewColumnsMatchesTheReferenceOnOddShapes) {
  for (SmallGemmUnits units : kUnits) {
    SCOPED_TRACE(UnitsName(units));
    for (bool trans_b : {false, true}) {
      for (int m : {1, 5, 11, 12, 13, 25, 100}) {
        for (int n : {1, 6, 8, 9, 15, 16}) {
          for (int k : {1, 2, 11, 25, 150}) {
            SCOPED_TRACE(absl::StrCat("m ", m, " n ", n, " k ", k,
                                      trans_b ? " B transposed" : ""));
            const std::vector<float> a =
                Integers(static_cast<size_t>(m) * k, 1);
            const std::vector<float> b =
                Integers(static_cast<size_t>(k) * n, 2);
            const std::vector<float> c0 =
                Integers(static_cast<size_t>(m) * n, 3);
            std::vector<float> c = c0;
            GemmFewColumns(m, n, k, 2.0f, a.data(), b.data(), trans_b, 0.5f,
                           c.data(), units);
            EXPECT_EQ(c,
                      Reference(false, trans_b, m, n, k, 2.0f, a, b, 0.5f, c0));
            // beta 0: C's old values, NaN here, are not read.
            std::vector<float> fresh(static_cast<size_t>(m) * n, std::nanf(""));
            GemmFewColumns(m, n, k, 1.0f, a.data(), b.data(), trans_b, 0.0f,
                           fresh.data(), units);
            EXPECT_EQ(fresh,
                      Reference(false, trans_b, m, n, k, 1.0f, a, b, 0.0f, c0));
          }
        }
      }
    }
  }
}

TEST_F(CpuSmallGemmTest, FewRowsMatchesTheReferenceOnOddShapes) {
  for (SmallGemmUnits units : kUnits) {
    SCOPED_TRACE(UnitsName(units));
    for (int m : {1, 3, 6, 8, 9, 16}) {
      for (int n : {1, 6, 13, 14, 25, 27, 150}) {
        for (int k : {1, 2, 7, 130, 300}) {
          SCOPED_TRACE(absl::StrCat("m ", m, " n ", n, " k ", k));
          // A is stored k x m (op(A) = A^T), B k x n.
          const std::vector<float> a = Integers(static_cast<size_t>(k) * m, 4);
          const std::vector<float> b = Integers(static_cast<size_t>(k) * n, 5);
          const std::vector<float> c0 = Integers(static_cast<size_t>(m) * n, 6);
          std::vector<float> c = c0;
          GemmFewRows(m, n, k, 2.0f, a.data(), b.data(), 0.5f, c.data(), units);
          EXPECT_EQ(c, Reference(true, false, m, n, k, 2.0f, a, b, 0.5f, c0));
          std::vector<float> fresh(static_cast<size_t>(m) * n, std::nanf(""));
          GemmFewRows(m, n, k, 1.0f, a.data(), b.data(), 0.0f, fresh.data(),
                      units);
          EXPECT_EQ(fresh,
                    Reference(true, false, m, n, k, 1.0f, a, b, 0.0f, c0));
        }
      }
    }
  }
}

TEST_F(CpuSmallGemmTest, TheWidestBuildGivesAvx2sBitsOnAnyValues) {
  // Values whose products and sums round, unlike the integers above: each
  // value of C must still be the same bits from both builds (the same
  // fused multiply-adds in the same order). Where the CPU has no AVX-512
  // the widest build is AVX2's and this holds trivially.
  auto values = [](size_t n, float phase) {
    std::vector<float> v(n);
    for (size_t i = 0; i < n; ++i) {
      v[i] = std::sin(static_cast<float>(i) * 0.37f + phase) * 1.7f;
    }
    return v;
  };
  for (int side : {1, 5, 6, 8, 9, 12, 16}) {
    for (int big : {1, 23, 24, 25, 26, 27, 130, 1100}) {
      SCOPED_TRACE(absl::StrCat("side ", side, " other side ", big));
      const int k = 150;
      const std::vector<float> a = values(static_cast<size_t>(big) * k, 0.1f);
      const std::vector<float> b = values(static_cast<size_t>(side) * k, 0.2f);
      const std::vector<float> c0 =
          values(static_cast<size_t>(big) * side, 0.3f);
      std::vector<float> wide = c0, narrow = c0;
      GemmFewColumns(big, side, k, 0.7f, a.data(), b.data(), true, 0.5f,
                     wide.data(), SmallGemmUnits::kWidest);
      GemmFewColumns(big, side, k, 0.7f, a.data(), b.data(), true, 0.5f,
                     narrow.data(), SmallGemmUnits::kAvx2);
      EXPECT_EQ(wide, narrow);
      // Few rows: A is k' x side, B k' x columns, summed over k' = 300.
      const int rows = 300, columns = std::min(big, kSmallGemmMaxColumns);
      const std::vector<float> x =
          values(static_cast<size_t>(rows) * side, 0.4f);
      const std::vector<float> y =
          values(static_cast<size_t>(rows) * columns, 0.5f);
      const std::vector<float> z0 =
          values(static_cast<size_t>(side) * columns, 0.6f);
      std::vector<float> z_wide = z0, z_narrow = z0;
      GemmFewRows(side, columns, rows, 0.7f, x.data(), y.data(), 0.5f,
                  z_wide.data(), SmallGemmUnits::kWidest);
      GemmFewRows(side, columns, rows, 0.7f, x.data(), y.data(), 0.5f,
                  z_narrow.data(), SmallGemmUnits::kAvx2);
      EXPECT_EQ(z_wide, z_narrow);
    }
  }
}

TEST_F(CpuSmallGemmTest, TakesTheLargestInnerSizeAndColumnCount) {
  const int m = 20, k = kSmallGemmMaxInner, n = kSmallGemmSide;
  const std::vector<float> a = Integers(static_cast<size_t>(m) * k, 7);
  const std::vector<float> b = Integers(static_cast<size_t>(k) * n, 8);
  std::vector<float> c(static_cast<size_t>(m) * n);
  GemmFewColumns(m, n, k, 1.0f, a.data(), b.data(), true, 0.0f, c.data());
  EXPECT_EQ(c, Reference(false, true, m, n, k, 1.0f, a, b, 0.0f, c));

  const int rows = 40, columns = kSmallGemmMaxColumns, side = kSmallGemmSide;
  const std::vector<float> x = Integers(static_cast<size_t>(rows) * side, 9);
  const std::vector<float> y =
      Integers(static_cast<size_t>(rows) * columns, 10);
  std::vector<float> z(static_cast<size_t>(side) * columns);
  GemmFewRows(side, columns, rows, 1.0f, x.data(), y.data(), 0.0f, z.data());
  EXPECT_EQ(z,
            Reference(true, false, side, columns, rows, 1.0f, x, y, 0.0f, z));
}

// Pages whose last bytes hold a matrix, followed by a page that may not be
// touched: a kernel that reads or writes past the matrix's end crashes the
// test instead of passing by luck.
class GuardedFloats {
 public:
  explicit GuardedFloats(const std::vector<float>& values) {
    const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    const size_t bytes = values.size() * sizeof(float);
    data_pages_ = (bytes + page - 1) / page;
    length_ = (data_pages_ + 1) * page;
    void* p = mmap(nullptr, length_, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return;
    base_ = static_cast<char*>(p);
    if (mprotect(base_ + data_pages_ * page, page, PROT_NONE) != 0) return;
    data_ = reinterpret_cast<float*>(base_ + data_pages_ * page - bytes);
    for (size_t i = 0; i < values.size(); ++i) data_[i] = values[i];
  }
  GuardedFloats(const GuardedFloats&) = delete;
  GuardedFloats& operator=(const GuardedFloats&) = delete;
  ~GuardedFloats() {
    if (base_ != nullptr) munmap(base_, length_);
  }
  float* data() const { return data_; }  // null if the mapping failed

 private:
  char* base_ = nullptr;
  size_t data_pages_ = 0;
  size_t length_ = 0;
  float* data_ = nullptr;
};

TEST_F(CpuSmallGemmTest, TouchesNothingPastTheEndOfItsMatrices) {
  for (SmallGemmUnits units : kUnits)
    for (int side : {1, 3, 6, 7, 9, 15, 16}) {
      SCOPED_TRACE(absl::StrCat("small side ", side, ", ", UnitsName(units)));
      const int rows = 37, inner = 5;
      // Few columns: A rows x inner, B side x inner (transposed), C rows x
      // side.
      const std::vector<float> a =
          Integers(static_cast<size_t>(rows) * inner, 11);
      const std::vector<float> b =
          Integers(static_cast<size_t>(side) * inner, 12);
      GuardedFloats guarded_a(a), guarded_b(b),
          guarded_c(std::vector<float>(static_cast<size_t>(rows) * side));
      ASSERT_NE(guarded_a.data(), nullptr);
      ASSERT_NE(guarded_b.data(), nullptr);
      ASSERT_NE(guarded_c.data(), nullptr);
      GemmFewColumns(rows, side, inner, 1.0f, guarded_a.data(),
                     guarded_b.data(), true, 0.0f, guarded_c.data(), units);
      const std::vector<float> want =
          Reference(false, true, rows, side, inner, 1.0f, a, b, 0.0f,
                    std::vector<float>(static_cast<size_t>(rows) * side));
      EXPECT_EQ(
          std::vector<float>(guarded_c.data(), guarded_c.data() + want.size()),
          want);

      // Few rows: A rows x side (its rows are what the kernels read 8 or 16
      // values of at a time), B rows x inner, C side x inner.
      const std::vector<float> x =
          Integers(static_cast<size_t>(rows) * side, 13);
      const std::vector<float> y =
          Integers(static_cast<size_t>(rows) * inner, 14);
      GuardedFloats guarded_x(x), guarded_y(y),
          guarded_z(std::vector<float>(static_cast<size_t>(side) * inner));
      ASSERT_NE(guarded_x.data(), nullptr);
      ASSERT_NE(guarded_y.data(), nullptr);
      ASSERT_NE(guarded_z.data(), nullptr);
      GemmFewRows(side, inner, rows, 1.0f, guarded_x.data(), guarded_y.data(),
                  0.0f, guarded_z.data(), units);
      const std::vector<float> want_z =
          Reference(true, false, side, inner, rows, 1.0f, x, y, 0.0f,
                    std::vector<float>(static_cast<size_t>(side) * inner));
      EXPECT_EQ(std::vector<float>(guarded_z.data(),
                                   guarded_z.data() + want_z.size()),
                want_z);
    }
}

// Single-channel images in zero-bordered copies, and Im2Col's matrix of
// the same patches, by the definition.
struct Patches {
  std::vector<float> images;
  ImagePatches view;
  std::vector<float> matrix;  // rows x kernel * kernel
  int rows = 0;
};

Patches MakePatches(int batch, int height, int width, int kernel, int padding,
                    float phase) {
  Patches p;
  const int row_stride = width + 2 * padding;
  const size_t image_stride =
      static_cast<size_t>(row_stride) * (height + 2 * padding);
  p.images.assign(image_stride * batch, 0.0f);
  for (int n = 0; n < batch; ++n) {
    for (int y = 0; y < height; ++y) {
      for (int x = 0; x < width; ++x) {
        p.images[n * image_stride + (y + padding) * row_stride + x + padding] =
            std::sin(static_cast<float>((n * height + y) * width + x) * 0.61f +
                     phase) *
            1.3f;
      }
    }
  }
  const int out_height = height + 2 * padding - kernel + 1;
  const int out_width = width + 2 * padding - kernel + 1;
  p.view = {p.images.data(), image_stride, row_stride,
            out_height,      out_width,    kernel};
  p.rows = batch * out_height * out_width;
  for (int n = 0; n < batch; ++n) {
    for (int oy = 0; oy < out_height; ++oy) {
      for (int ox = 0; ox < out_width; ++ox) {
        for (int ky = 0; ky < kernel; ++ky) {
          for (int kx = 0; kx < kernel; ++kx) {
            p.matrix.push_back(
                p.images[n * image_stride + (oy + ky) * row_stride + ox + kx]);
          }
        }
      }
    }
  }
  return p;
}

std::vector<float> Wave(size_t n, float phase) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) {
    v[i] = std::cos(static_cast<float>(i) * 0.29f + phase) * 0.9f;
  }
  return v;
}

TEST_F(CpuSmallGemmTest, PatchesReadInPlaceGiveIm2ColsBits) {
  // Values that round, so that the same bits mean the same operations in
  // the same order as the products on Im2Col's matrix (and the bias added
  // after them, as the backend's AddBias does).
  struct Shape {
    int batch, height, width, kernel, padding;
  };
  for (const Shape& shape :
       {Shape{3, 28, 28, 5, 2}, Shape{2, 9, 13, 3, 1}, Shape{2, 7, 40, 5, 0},
        Shape{1, 5, 5, 5, 0}, Shape{4, 6, 6, 1, 0}, Shape{2, 12, 10, 7, 3},
        Shape{1, 10, 10, 4, 0}}) {
    const Patches p = MakePatches(shape.batch, shape.height, shape.width,
                                  shape.kernel, shape.padding, 0.3f);
    const int k = shape.kernel * shape.kernel;
    for (SmallGemmUnits units : kUnits) {
      for (int filters : {1, 6, 8, 9, 16}) {
        SCOPED_TRACE(absl::StrCat(UnitsName(units), ", ", shape.batch, " of ",
                                  shape.height, "x", shape.width, ", kernel ",
                                  shape.kernel, " pad ", shape.padding, ", ",
                                  filters, " filters"));
        const std::vector<float> w =
            Wave(static_cast<size_t>(filters) * k, 0.1f);
        const std::vector<float> bias = Wave(filters, 0.7f);
        const size_t out = static_cast<size_t>(p.rows) * filters;
        std::vector<float> want(out, std::nanf(""));
        GemmFewColumns(p.rows, filters, k, 1.0f, p.matrix.data(), w.data(),
                       true, 0.0f, want.data(), units);
        for (size_t i = 0; i < out; ++i) want[i] += bias[i % filters];
        std::vector<float> got(out, std::nanf(""));
        GemmFewColumnsOfPatches(p.view, p.rows, filters, k, 1.0f, w.data(),
                                true, bias.data(), got.data(), units);
        EXPECT_EQ(got, want);
        // No bias, another scale.
        GemmFewColumns(p.rows, filters, k, 0.5f, p.matrix.data(), w.data(),
                       true, 0.0f, want.data(), units);
        GemmFewColumnsOfPatches(p.view, p.rows, filters, k, 0.5f, w.data(),
                                true, nullptr, got.data(), units);
        EXPECT_EQ(got, want);

        // The weight gradient: dout (rows x filters) against the patches.
        const std::vector<float> dout = Wave(out, 0.2f);
        std::vector<float> dw_want(static_cast<size_t>(filters) * k,
                                   std::nanf(""));
        GemmFewRows(filters, k, p.rows, 1.0f, dout.data(), p.matrix.data(),
                    0.0f, dw_want.data(), units);
        std::vector<float> dw(dw_want.size(), std::nanf(""));
        std::vector<float> db(filters, std::nanf(""));
        GemmFewRowsOfPatches(filters, k, p.rows, 1.0f, dout.data(), p.view,
                             dw.data(), db.data(), units);
        EXPECT_EQ(dw, dw_want);
        // The bias's gradient: dout's columns summed row by row, as the
        // backend's ColumnSums does.
        std::vector<float> db_want(filters, 0.0f);
        for (int r = 0; r < p.rows; ++r) {
          for (int f = 0; f < filters; ++f) {
            db_want[f] += dout[static_cast<size_t>(r) * filters + f];
          }
        }
        EXPECT_EQ(db, db_want);
        // Without the column sums, another scale.
        GemmFewRows(filters, k, p.rows, 2.0f, dout.data(), p.matrix.data(),
                    0.0f, dw_want.data(), units);
        GemmFewRowsOfPatches(filters, k, p.rows, 2.0f, dout.data(), p.view,
                             dw.data(), nullptr, units);
        EXPECT_EQ(dw, dw_want);
      }
    }
  }
}

TEST_F(CpuSmallGemmTest, Col2ImOfProductAddsEachWindowsRowWhereItCameFrom) {
  if (!SmallGemmHasAvx512()) {
    GTEST_SKIP() << "Col2ImOfProduct needs AVX-512 (the backend takes Gemm "
                    "and Col2Im without it)";
  }
  using testutil::Window;
  // LeNet's second convolution (150 values a window: registers of 16 and
  // a masked last one), padding, a stride, and windows that overlap.
  for (const WindowGeometry& g :
       {Window(14, 14, 6, 5, 1, 0), Window(7, 5, 3, 3, 2, 1),
        Window(6, 9, 2, 4, 1, 3), Window(9, 7, 1, 2, 1, 0),
        Window(5, 5, 20, 5, 1, 2)}) {
    for (int m : {1, 6, 16}) {
      SCOPED_TRACE(absl::StrCat(g.height, "x", g.width, "x", g.channels, " k",
                                g.kernel, " s", g.stride, " p", g.padding, ", ",
                                m, " filters"));
      constexpr int kBatch = 2;
      const int rows = kBatch * g.out_height * g.out_width;
      const int k = g.patch();
      ASSERT_LE(k, kSmallGemmMaxInner);
      // Integers: every product and sum is exact, whatever the order.
      const std::vector<float> dy = Integers(static_cast<size_t>(rows) * m, 21);
      const std::vector<float> w = Integers(static_cast<size_t>(m) * k, 22);
      const size_t inputs =
          static_cast<size_t>(kBatch) * g.height * g.width * g.channels;
      std::vector<double> want(inputs, 0.0);
      for (int r = 0; r < rows; ++r) {
        const int ox = r % g.out_width;
        const int oy = r / g.out_width % g.out_height;
        const int n = r / (g.out_width * g.out_height);
        for (int j = 0; j < k; ++j) {
          const int c = j % g.channels;
          const int kx = j / g.channels % g.kernel;
          const int ky = j / (g.channels * g.kernel);
          const int iy = oy * g.stride - g.padding + ky;
          const int ix = ox * g.stride - g.padding + kx;
          if (iy < 0 || iy >= g.height || ix < 0 || ix >= g.width) continue;
          double sum = 0;
          for (int i = 0; i < m; ++i) {
            sum += double{dy[static_cast<size_t>(r) * m + i]} *
                   w[static_cast<size_t>(i) * k + j];
          }
          want[((static_cast<size_t>(n) * g.height + iy) * g.width + ix) *
                   g.channels +
               c] += sum;
        }
      }
      std::vector<float> dx(inputs, std::nanf(""));
      Col2ImOfProduct(g, kBatch, m, dy.data(), w.data(), dx.data());
      EXPECT_EQ(dx, std::vector<float>(want.begin(), want.end()));
    }
  }
}

}  // namespace
}  // namespace monsoon::worker
