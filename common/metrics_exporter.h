// MetricsExporter serves a daemon's metrics on GET /metrics in Prometheus'
// text format, with prometheus-cpp: its Exposer (an embedded civetweb HTTP
// server with threads of its own) asks each added Collectable for its
// metric families at every scrape. Every exporter also serves
// monsoon_build_info and the process metrics Prometheus' own clients give
// (process_cpu_seconds_total, process_resident_memory_bytes,
// process_open_fds, process_start_time_seconds). Thread-safe; the
// collectables must be thread-safe too.
#ifndef MONSOON_COMMON_METRICS_EXPORTER_H_
#define MONSOON_COMMON_METRICS_EXPORTER_H_

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/histogram.h"
#include "prometheus/collectable.h"
#include "prometheus/metric_family.h"
#include "proto/config.pb.h"

namespace prometheus {
class Exposer;
}  // namespace prometheus

namespace monsoon::common {

class MetricsExporter {
 public:
  // Listens on `listen` (HOST:PORT; port 0: any free one). `build_info`
  // becomes the labels of monsoon_build_info (role, mode, config, ...).
  // UNAVAILABLE when it cannot listen, INVALID_ARGUMENT for a bad address.
  static absl::StatusOr<std::unique_ptr<MetricsExporter>> Start(
      const std::string& listen,
      const std::map<std::string, std::string>& build_info);
  // For a daemon's --metrics_listen: null when `listen` is empty (no
  // metrics); else Start(listen, build_info), serving `collectables` too.
  static absl::StatusOr<std::unique_ptr<MetricsExporter>> StartIfListening(
      const std::string& listen,
      const std::map<std::string, std::string>& build_info,
      const std::vector<std::shared_ptr<prometheus::Collectable>>&
          collectables = {});
  ~MetricsExporter();
  MetricsExporter(const MetricsExporter&) = delete;
  MetricsExporter& operator=(const MetricsExporter&) = delete;

  // Serves `collectable`'s families too, for as long as it lives.
  void Add(const std::shared_ptr<prometheus::Collectable>& collectable);

  // The port it listens on.
  int port() const { return port_; }

 private:
  MetricsExporter() = default;

  std::unique_ptr<prometheus::Exposer> exposer_;
  std::vector<std::shared_ptr<prometheus::Collectable>> owned_;
  std::string host_;  // where it listens, as this host reaches it
  int port_ = 0;
};

// monsoon_build_info's labels for a daemon of `role` running `resolved`:
// role, mode, config (its fingerprint), and `extra` (shard, rank).
std::map<std::string, std::string> BuildInfoLabels(
    const std::string& role, const TrainingConfig& resolved,
    std::map<std::string, std::string> extra = {});

// Helpers for collectables that build their families at each scrape.
prometheus::MetricFamily Gauge(const std::string& name, const std::string& help,
                               double value);
prometheus::MetricFamily Counter(const std::string& name,
                                 const std::string& help, double value);
// A family with one metric per label value (`label` = key of `values`).
prometheus::MetricFamily LabeledCounter(
    const std::string& name, const std::string& help, const std::string& label,
    const std::map<std::string, double>& values);
// A labelled gauge family, as LabeledCounter.
prometheus::MetricFamily LabeledGauge(
    const std::string& name, const std::string& help, const std::string& label,
    const std::map<std::string, double>& values);
// A histogram family with one metric per label value (`label` empty: one
// metric, `values` with the one key "").
prometheus::MetricFamily HistogramFamily(
    const std::string& name, const std::string& help, const std::string& label,
    const std::map<std::string, Histogram::Snapshot>& values);

}  // namespace monsoon::common

#endif  // MONSOON_COMMON_METRICS_EXPORTER_H_
