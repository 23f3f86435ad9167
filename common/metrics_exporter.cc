#include "common/metrics_exporter.h"

#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <exception>
#include <fstream>
#include <sstream>
#include <thread>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/accept_guard.h"
#include "common/config.h"
#include "prometheus/exposer.h"

namespace monsoon::common {
namespace {

using prometheus::ClientMetric;
using prometheus::MetricFamily;
using prometheus::MetricType;

// What Prometheus' client libraries export for a process, from /proc.
class ProcessMetrics : public prometheus::Collectable {
 public:
  ProcessMetrics() : start_(absl::Now()) {}

  std::vector<MetricFamily> Collect() const override {
    std::vector<MetricFamily> families;
    families.push_back(Counter("process_cpu_seconds_total",
                               "User and system CPU time spent, in seconds.",
                               CpuSeconds()));
    families.push_back(Gauge("process_resident_memory_bytes",
                             "Resident memory size in bytes.",
                             ResidentBytes()));
    families.push_back(
        Gauge("process_open_fds", "Open file descriptors.",
              static_cast<double>(OpenFileDescriptors())));
    families.push_back(Gauge("process_max_fds",
                             "The soft limit on open file descriptors.",
                             static_cast<double>(FileDescriptorLimit())));
    families.push_back(Counter(
        "monsoon_connections_shed_total",
        "Incoming connections closed at once because the process was near "
        "its limit on open files (common/accept_guard.h).",
        static_cast<double>(ConnectionsShed())));
    families.push_back(
        Gauge("process_start_time_seconds",
              "Start time of the process since the Unix epoch, in seconds.",
              absl::ToDoubleSeconds(start_ - absl::UnixEpoch())));
    return families;
  }

 private:
  // utime + stime of /proc/self/stat (fields 14 and 15), in seconds.
  static double CpuSeconds() {
    std::ifstream in("/proc/self/stat");
    std::string stat((std::istreambuf_iterator<char>(in)),
                     std::istreambuf_iterator<char>());
    // The command name (field 2) may hold spaces: count from its ')'.
    const size_t close = stat.rfind(')');
    if (close == std::string::npos) return 0;
    std::istringstream fields(stat.substr(close + 2));
    std::string field;
    double ticks = 0;
    for (int i = 3; i <= 15 && fields >> field; ++i) {
      if (i >= 14) {
        double value = 0;
        if (absl::SimpleAtod(field, &value)) ticks += value;
      }
    }
    return ticks / static_cast<double>(sysconf(_SC_CLK_TCK));
  }

  static double ResidentBytes() {
    std::ifstream in("/proc/self/statm");
    double pages_total = 0, pages_resident = 0;
    in >> pages_total >> pages_resident;
    return pages_resident * static_cast<double>(sysconf(_SC_PAGESIZE));
  }

  const absl::Time start_;
};

// monsoon_build_info{...} 1.
class BuildInfo : public prometheus::Collectable {
 public:
  explicit BuildInfo(std::map<std::string, std::string> labels)
      : labels_(std::move(labels)) {}

  std::vector<MetricFamily> Collect() const override {
    MetricFamily family = Gauge(
        "monsoon_build_info",
        "Always 1; its labels say what this daemon runs (role, mode, config "
        "fingerprint).",
        1);
    for (const auto& [name, value] : labels_) {
      family.metric[0].label.push_back({name, value});
    }
    return {family};
  }

 private:
  const std::map<std::string, std::string> labels_;
};

}  // namespace

std::map<std::string, std::string> BuildInfoLabels(
    const std::string& role, const TrainingConfig& resolved,
    std::map<std::string, std::string> extra) {
  extra["role"] = role;
  extra["mode"] = ModeName(resolved.mode());
  extra["config"] = absl::StrFormat("%016x", ConfigFingerprint(resolved));
  return extra;
}

MetricFamily Gauge(const std::string& name, const std::string& help,
                   double value) {
  MetricFamily family{name, help, MetricType::Gauge, {}};
  ClientMetric metric;
  metric.gauge.value = value;
  family.metric.push_back(std::move(metric));
  return family;
}

MetricFamily Counter(const std::string& name, const std::string& help,
                     double value) {
  MetricFamily family{name, help, MetricType::Counter, {}};
  ClientMetric metric;
  metric.counter.value = value;
  family.metric.push_back(std::move(metric));
  return family;
}

MetricFamily LabeledCounter(const std::string& name, const std::string& help,
                            const std::string& label,
                            const std::map<std::string, double>& values) {
  MetricFamily family{name, help, MetricType::Counter, {}};
  for (const auto& [key, value] : values) {
    ClientMetric metric;
    metric.label.push_back({label, key});
    metric.counter.value = value;
    family.metric.push_back(std::move(metric));
  }
  return family;
}

MetricFamily LabeledGauge(const std::string& name, const std::string& help,
                          const std::string& label,
                          const std::map<std::string, double>& values) {
  MetricFamily family{name, help, MetricType::Gauge, {}};
  for (const auto& [key, value] : values) {
    ClientMetric metric;
    metric.label.push_back({label, key});
    metric.gauge.value = value;
    family.metric.push_back(std::move(metric));
  }
  return family;
}

MetricFamily HistogramFamily(
    const std::string& name, const std::string& help, const std::string& label,
    const std::map<std::string, Histogram::Snapshot>& values) {
  MetricFamily family{name, help, MetricType::Histogram, {}};
  for (const auto& [key, snapshot] : values) {
    ClientMetric metric;
    if (!label.empty()) metric.label.push_back({label, key});
    for (size_t i = 0; i < snapshot.upper_bounds.size(); ++i) {
      metric.histogram.bucket.push_back(
          {snapshot.cumulative[i], snapshot.upper_bounds[i]});
    }
    // The serializer adds +Inf's bucket from the count.
    metric.histogram.sample_count = snapshot.count;
    metric.histogram.sample_sum = snapshot.sum;
    family.metric.push_back(std::move(metric));
  }
  return family;
}

absl::StatusOr<std::unique_ptr<MetricsExporter>> MetricsExporter::Start(
    const std::string& listen,
    const std::map<std::string, std::string>& build_info) {
  const size_t colon = listen.rfind(':');
  int port = -1;
  if (colon == std::string::npos || colon == 0 ||
      !absl::SimpleAtoi(listen.substr(colon + 1), &port) || port < 0 ||
      port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("--metrics_listen='", listen,
                     "' is not HOST:PORT with a port from 0 to 65535"));
  }
  std::unique_ptr<MetricsExporter> exporter(new MetricsExporter());
  try {
    exporter->exposer_ = std::make_unique<prometheus::Exposer>(listen, 1);
  } catch (const std::exception& e) {
    return absl::UnavailableError(
        absl::StrCat("cannot serve metrics on '", listen, "': ", e.what(),
                     " (is the address valid and the port free?)"));
  }
  const std::vector<int> ports = exporter->exposer_->GetListeningPorts();
  if (ports.empty()) {
    return absl::UnavailableError(
        absl::StrCat("cannot serve metrics on '", listen, "'"));
  }
  exporter->port_ = ports[0];
  absl::string_view host(listen.data(), colon);
  if (absl::ConsumePrefix(&host, "[")) absl::ConsumeSuffix(&host, "]");
  // Any address: this host's loopback reaches it.
  if (host.empty() || host == "0.0.0.0") host = "127.0.0.1";
  if (host == "::") host = "::1";
  exporter->host_ = std::string(host);
  exporter->Add(std::make_shared<BuildInfo>(build_info));
  exporter->Add(std::make_shared<ProcessMetrics>());
  return exporter;
}

absl::StatusOr<std::unique_ptr<MetricsExporter>>
MetricsExporter::StartIfListening(
    const std::string& listen,
    const std::map<std::string, std::string>& build_info,
    const std::vector<std::shared_ptr<prometheus::Collectable>>& collectables) {
  if (listen.empty()) return std::unique_ptr<MetricsExporter>();
  absl::StatusOr<std::unique_ptr<MetricsExporter>> exporter =
      Start(listen, build_info);
  if (!exporter.ok()) return exporter.status();
  for (const auto& collectable : collectables) (*exporter)->Add(collectable);
  return exporter;
}

namespace {

// Opens a TCP connection to `host`:`port` and closes it (whether it is
// accepted does not matter), waiting at most 100 ms for it.
void Knock(const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* found = nullptr;
  if (getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found) !=
      0) {
    return;
  }
  for (addrinfo* a = found; a != nullptr; a = a->ai_next) {
    const int fd =
        socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK,
               a->ai_protocol);
    if (fd < 0) continue;
    bool connected = connect(fd, a->ai_addr, a->ai_addrlen) == 0;
    if (!connected && errno == EINPROGRESS) {
      pollfd done = {fd, POLLOUT, 0};
      connected = poll(&done, 1, /*timeout_ms=*/100) == 1;
    }
    close(fd);
    if (connected) break;
  }
  freeaddrinfo(found);
}

}  // namespace

MetricsExporter::~MetricsExporter() {
  // Stopping civetweb waits for its listening thread, which sees the stop
  // only once its poll() returns: at its timeout (1.7 s at each daemon's
  // exit, measured), or at once when a connection comes. So connections
  // come, every 20 ms until it has stopped (exit in 14-26 ms).
  absl::Notification stopped;
  std::thread knocker([&] {
    do {
      Knock(host_, port_);
    } while (!stopped.WaitForNotificationWithTimeout(absl::Milliseconds(20)));
  });
  exposer_.reset();  // stops serving before the collectables go
  stopped.Notify();
  knocker.join();
}

void MetricsExporter::Add(
    const std::shared_ptr<prometheus::Collectable>& collectable) {
  owned_.push_back(collectable);
  exposer_->RegisterCollectable(collectable);
}

}  // namespace monsoon::common
