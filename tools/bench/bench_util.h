// What every benchmark under tools/bench shares: medians of repeated
// timings and the one-JSON-object-per-case output of --json. Stateless.
#ifndef MONSOON_TOOLS_BENCH_BENCH_UTIL_H_
#define MONSOON_TOOLS_BENCH_BENCH_UTIL_H_

#include <string>
#include <utility>
#include <vector>

namespace monsoon::tools {

struct Summary {
  double p50 = 0;
  double p10 = 0;
  double p90 = 0;
  int count = 0;
};

// Starts this benchmark again (exec, same arguments) with
// OPENBLAS_NUM_THREADS=1 in its environment unless the variable is set
// already. OpenBLAS starts a thread per core when it loads, before main,
// and openblas_set_num_threads(1), which each CPU backend calls, sets them
// spinning on sched_yield for about 0.1 s before they sleep: in a benchmark
// that builds a backend per case, on the cores the case is timed on. The
// workers launch_local starts get the same variable. Returns (and the
// benchmark runs as it is) only if the exec fails.
void ExecWithOneOpenBlasThread(char** argv);

// Percentiles of `samples` (nearest rank); all zero when it is empty.
Summary Summarize(std::vector<double> samples);

// One flat JSON object: {"key": value, ...}. Values are numbers, or strings
// when given as strings.
class JsonLine {
 public:
  JsonLine& Add(const std::string& key, const std::string& value);
  JsonLine& Add(const std::string& key, const char* value);
  JsonLine& Add(const std::string& key, double value);
  JsonLine& Add(const std::string& key, long long value);
  JsonLine& Add(const std::string& key, int value) {
    return Add(key, static_cast<long long>(value));
  }
  std::string str() const;

 private:
  std::vector<std::pair<std::string, std::string>> fields_;  // key, JSON value
};

}  // namespace monsoon::tools

#endif  // MONSOON_TOOLS_BENCH_BENCH_UTIL_H_
