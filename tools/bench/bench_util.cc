#include "tools/bench/bench_util.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "tools/metrics.h"

namespace monsoon::tools {
namespace {

// The value at fraction q of the sorted samples (nearest rank).
double At(const std::vector<double>& sorted, double q) {
  const size_t n = sorted.size();
  size_t rank = static_cast<size_t>(std::ceil(q * static_cast<double>(n)));
  rank = std::clamp<size_t>(rank, 1, n);
  return sorted[rank - 1];
}

}  // namespace

void ExecWithOneOpenBlasThread(char** argv) {
  if (std::getenv("OPENBLAS_NUM_THREADS") != nullptr) return;
  setenv("OPENBLAS_NUM_THREADS", "1", /*overwrite=*/1);
  execv("/proc/self/exe", argv);
  std::fprintf(stderr,
               "%s: cannot start again with OPENBLAS_NUM_THREADS=1 (%s); "
               "running as it is, OpenBLAS's idle threads may spin on the "
               "cores: set the variable to be sure\n",
               argv[0], std::strerror(errno));
}

Summary Summarize(std::vector<double> samples) {
  Summary summary;
  if (samples.empty()) return summary;
  std::sort(samples.begin(), samples.end());
  summary.count = static_cast<int>(samples.size());
  summary.p50 = At(samples, 0.5);
  summary.p10 = At(samples, 0.1);
  summary.p90 = At(samples, 0.9);
  return summary;
}

JsonLine& JsonLine::Add(const std::string& key, const std::string& value) {
  fields_.emplace_back(key, JsonQuoted(value));
  return *this;
}

JsonLine& JsonLine::Add(const std::string& key, const char* value) {
  return Add(key, std::string(value));
}

JsonLine& JsonLine::Add(const std::string& key, double value) {
  fields_.emplace_back(
      key, std::isfinite(value) ? absl::StrFormat("%.6g", value) : "null");
  return *this;
}

JsonLine& JsonLine::Add(const std::string& key, long long value) {
  fields_.emplace_back(key, absl::StrCat(value));
  return *this;
}

std::string JsonLine::str() const {
  std::string out = "{";
  for (size_t i = 0; i < fields_.size(); ++i) {
    if (i > 0) out += ", ";
    absl::StrAppend(&out, JsonQuoted(fields_[i].first), ": ", fields_[i].second);
  }
  return out + "}";
}

}  // namespace monsoon::tools
