#include "tools/emulated_network.h"

#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/log.h"
#include "tools/process_supervisor.h"

namespace monsoon::tools {
namespace {

constexpr char kIp[] = "/usr/sbin/ip";
constexpr char kTc[] = "/usr/sbin/tc";
constexpr int kServerPort = 5000;

// Runs argv; INTERNAL with the command and its output unless it exits 0.
absl::Status Run(const std::vector<std::string>& argv,
                 std::string* output = nullptr) {
  std::string out;
  absl::StatusOr<int> code = RunCommand(argv, &out);
  if (output != nullptr) *output = out;
  if (!code.ok()) return code.status();
  if (*code != 0) {
    return absl::InternalError(
        absl::StrCat(absl::StrJoin(argv, " "),
                     " failed: ", absl::StripAsciiWhitespace(out)));
  }
  return absl::OkStatus();
}

absl::Status Ip(std::vector<std::string> args) {
  args.insert(args.begin(), kIp);
  return Run(args);
}

// Removes the namespaces and bridges of runs whose process has died.
void RemoveStaleNetworks() {
  std::string list;
  if (!Run({kIp, "netns", "list"}, &list).ok()) return;
  for (absl::string_view line : absl::StrSplit(list, '\n')) {
    absl::string_view name = line.substr(0, line.find(' '));
    if (!absl::ConsumePrefix(&name, "mon")) continue;
    const size_t dash = name.find('-');
    int pid = 0;
    if (dash == absl::string_view::npos ||
        !absl::SimpleAtoi(name.substr(0, dash), &pid) || pid <= 0) {
      continue;
    }
    if (kill(pid, 0) == 0 || errno != ESRCH) continue;  // still running
    const std::string ns = absl::StrCat("mon", name);
    common::Log("network: removing %s, left by a run that died", ns);
    Ip({"netns", "del", ns}).IgnoreError();
    Ip({"link", "del", absl::StrCat("mon", pid, "d")}).IgnoreError();
    Ip({"link", "del", absl::StrCat("mon", pid, "c")}).IgnoreError();
  }
}

}  // namespace

absl::StatusOr<LinkSpec> ParseLink(absl::string_view text) {
  LinkSpec link;
  link.text = std::string(text);
  std::vector<absl::string_view> parts = absl::StrSplit(text, ',');
  auto bad = [&](absl::string_view why) {
    return absl::InvalidArgumentError(
        absl::StrCat("--link='", text, "': ", why,
                     " (expected RATE[,DELAY], e.g. 100mbit,2ms or 1gbit)"));
  };
  if (parts.empty() || parts.size() > 2) return bad("wrong number of parts");
  absl::string_view rate = absl::StripAsciiWhitespace(parts[0]);
  double scale = 0;
  for (const auto& [suffix, factor] :
       std::vector<std::pair<absl::string_view, double>>{
           {"gbit", 1e9}, {"mbit", 1e6}, {"kbit", 1e3}, {"bit", 1}}) {
    if (absl::ConsumeSuffix(&rate, suffix)) {
      scale = factor;
      break;
    }
  }
  double value = 0;
  if (scale == 0 || !absl::SimpleAtod(rate, &value) || !(value > 0)) {
    return bad("the rate needs a positive number and kbit, mbit or gbit");
  }
  link.rate_bits_per_s = static_cast<int64_t>(value * scale);
  if (link.rate_bits_per_s < 8000 || link.rate_bits_per_s > 400e9) {
    return bad("the rate must be from 8kbit to 400gbit");
  }
  if (parts.size() == 2) {
    absl::string_view delay = absl::StripAsciiWhitespace(parts[1]);
    double unit = 0;
    if (absl::ConsumeSuffix(&delay, "ms")) {
      unit = 1;
    } else if (absl::ConsumeSuffix(&delay, "us")) {
      unit = 1e-3;
    }
    double d = 0;
    if (unit == 0 || !absl::SimpleAtod(delay, &d) || d < 0 || d > 10000) {
      return bad("the delay needs a number from 0 to 10000 and ms or us");
    }
    link.delay_ms = d * unit;
  }
  return link;
}

absl::Status CheckNetworkPrivileges() {
  if (access(kIp, X_OK) != 0 || access(kTc, X_OK) != 0) {
    return absl::FailedPreconditionError(
        "--link needs iproute2's ip and tc (apt-get install iproute2)");
  }
  // CapEff bit 12 is CAP_NET_ADMIN.
  std::ifstream status("/proc/self/status");
  std::string line;
  uint64_t effective = 0;
  while (std::getline(status, line)) {
    absl::string_view rest = line;
    if (absl::ConsumePrefix(&rest, "CapEff:")) {
      absl::SimpleHexAtoi(absl::StripAsciiWhitespace(rest), &effective);
    }
  }
  if ((effective & (uint64_t{1} << 12)) == 0) {
    return absl::PermissionDeniedError(
        "--link creates network namespaces and shapes links: run as root "
        "(or with CAP_NET_ADMIN), or drop --link");
  }
  return absl::OkStatus();
}

absl::StatusOr<std::map<int, int64_t>> ParseWorkerRates(
    absl::string_view text) {
  std::map<int, int64_t> rates;
  for (absl::string_view spec :
       absl::StrSplit(text, ',', absl::SkipWhitespace())) {
    const size_t colon = spec.find(':');
    int rank = -1;
    absl::StatusOr<LinkSpec> rate = colon == absl::string_view::npos
                                        ? absl::InvalidArgumentError("no ':'")
                                        : ParseLink(spec.substr(colon + 1));
    if (colon == absl::string_view::npos ||
        !absl::SimpleAtoi(spec.substr(0, colon), &rank) || rank < 0 ||
        !rate.ok() || rate->delay_ms > 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--link_worker '", spec,
          "' is not RANK:RATE (e.g. 1:20mbit; the delay is --link's)"));
    }
    if (!rates.emplace(rank, rate->rate_bits_per_s).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("--link_worker rank ", rank, " is given twice"));
    }
  }
  return rates;
}

absl::StatusOr<std::unique_ptr<EmulatedNetwork>> EmulatedNetwork::Create(
    int servers, int workers, const LinkSpec& link,
    const std::map<int, int64_t>& worker_rates) {
  if (auto s = CheckNetworkPrivileges(); !s.ok()) return s;
  if (servers > 60 || workers > 120) {
    return absl::InvalidArgumentError(
        "--link supports at most 60 servers and 120 workers");
  }
  RemoveStaleNetworks();
  std::unique_ptr<EmulatedNetwork> network(new EmulatedNetwork());
  for (const auto& [rank, rate] : worker_rates) {
    if (rank >= workers) {
      return absl::InvalidArgumentError(
          absl::StrCat("--link_worker rank ", rank, " but a run of ", workers,
                       " workers has ranks 0 to ", workers - 1));
    }
  }
  absl::Status built = network->Build(servers, workers, link, worker_rates);
  if (!built.ok()) {
    network->TearDown().IgnoreError();
    return built;
  }
  return network;
}

absl::Status EmulatedNetwork::Shape(const std::string& netns,
                                    const std::string& device,
                                    const LinkSpec& link) {
  std::vector<std::string> tc = {kTc};
  if (!netns.empty()) {
    tc.push_back("-n");
    tc.push_back(netns);
  }
  tc.insert(tc.end(), {"qdisc", "add", "dev", device, "root"});
  const std::string rate = absl::StrCat(link.rate_bits_per_s, "bit");
  if (!netem_missing_) {
    std::vector<std::string> netem = tc;
    netem.insert(netem.end(), {"netem", "rate", rate, "limit", "100000"});
    if (link.delay_ms > 0) {
      netem.insert(netem.end(), {"delay", absl::StrCat(link.delay_ms, "ms")});
    }
    std::string output;
    absl::Status status = Run(netem, &output);
    if (status.ok()) return status;
    if (!absl::StrContains(output, "unknown")) return status;
    netem_missing_ = true;
    delay_emulated_ = link.delay_ms == 0;
    common::LogWarning(
        "network: this kernel has no netem qdisc: shaping the rate with tbf%s",
        link.delay_ms > 0 ? "; the delay goes to delay proxies" : "");
  }
  // tbf: the bucket must hold a few full-size (GSO) packets.
  const int64_t burst =
      std::max<int64_t>(128 * 1024, link.rate_bits_per_s / 8 / 250);
  tc.insert(tc.end(), {"tbf", "rate", rate, "burst", absl::StrCat(burst),
                       "latency", "100ms"});
  return Run(tc);
}

absl::Status EmulatedNetwork::Build(
    int servers, int workers, const LinkSpec& link,
    const std::map<int, int64_t>& worker_rates) {
  prefix_ = absl::StrCat("mon", getpid());
  const int subnet = getpid() % 250 + 1;
  const std::string data_bridge = prefix_ + "d";
  const std::string control_bridge = prefix_ + "c";
  const std::string data_net = absl::StrCat("10.77.", subnet, ".");
  const std::string control_net = absl::StrCat("10.78.", subnet, ".");
  for (const std::string& bridge : {data_bridge, control_bridge}) {
    if (auto s = Ip({"link", "add", bridge, "type", "bridge"}); !s.ok()) {
      return s;
    }
    bridges_.push_back(bridge);
    if (auto s = Ip({"link", "set", bridge, "up"}); !s.ok()) return s;
  }
  // The unplaced evaluator and launcher reach the servers through here.
  if (auto s = Ip({"addr", "add", control_net + "1/24", "dev", control_bridge});
      !s.ok()) {
    return s;
  }
  // One host: a namespace with a shaped link to the data bridge.
  auto add_host = [&](const std::string& role, int index, int host,
                      bool control, const LinkSpec& link) -> absl::Status {
    const std::string ns = absl::StrCat(prefix_, "-", role, index);
    if (auto s = Ip({"netns", "add", ns}); !s.ok()) return s;
    namespaces_.push_back(ns);
    const std::string outer = absl::StrCat(prefix_, role, index);
    std::vector<std::vector<std::string>> steps = {
        {"-n", ns, "link", "set", "lo", "up"},
        {"link", "add", outer, "type", "veth", "peer", "name", "eth0", "netns",
         ns},
        {"link", "set", outer, "master", data_bridge},
        {"link", "set", outer, "up"},
        {"-n", ns, "addr", "add", absl::StrCat(data_net, host, "/24"), "dev",
         "eth0"},
        {"-n", ns, "link", "set", "eth0", "up"},
    };
    if (control) {
      const std::string outer_control = absl::StrCat(prefix_, "c", index);
      steps.push_back({"link", "add", outer_control, "type", "veth", "peer",
                       "name", "ctl0", "netns", ns});
      steps.push_back({"link", "set", outer_control, "master", control_bridge});
      steps.push_back({"link", "set", outer_control, "up"});
      steps.push_back({"-n", ns, "addr", "add",
                       absl::StrCat(control_net, host, "/24"), "dev", "ctl0"});
      steps.push_back({"-n", ns, "link", "set", "ctl0", "up"});
    }
    for (const auto& step : steps) {
      if (auto s = Ip(step); !s.ok()) return s;
    }
    // Both directions: out of the host, and out of the bridge to the host.
    if (auto s = Shape(ns, "eth0", link); !s.ok()) return s;
    return Shape("", outer, link);
  };
  for (int s = 0; s < servers; ++s) {
    const int host = 10 + s;
    if (auto status = add_host("s", s, host, true, link); !status.ok()) {
      return status;
    }
    placement_.server_prefix.push_back(
        {kIp, "netns", "exec", namespaces_.back()});
    placement_.server_listen.push_back(absl::StrCat("0.0.0.0:", kServerPort));
    placement_.worker_addresses.push_back(
        absl::StrCat(data_net, host, ":", kServerPort));
    placement_.control_addresses.push_back(
        absl::StrCat(control_net, host, ":", kServerPort));
  }
  for (int w = 0; w < workers; ++w) {
    LinkSpec worker_link = link;
    if (auto it = worker_rates.find(w); it != worker_rates.end()) {
      worker_link.rate_bits_per_s = it->second;
      common::Log("network: worker %d's link shaped to %d bit/s", w,
                  it->second);
    }
    if (auto status = add_host("w", w, 100 + w, false, worker_link);
        !status.ok()) {
      return status;
    }
    placement_.worker_prefix.push_back(
        {kIp, "netns", "exec", namespaces_.back()});
    placement_.worker_hosts.push_back(absl::StrCat(data_net, 100 + w));
  }
  if (netem_missing_ && link.delay_ms > 0) {
    // A worker's path to a server crosses two links, each delayed one way.
    placement_.proxy_delay_ms = 2 * link.delay_ms;
    delay_emulated_ = true;
    delay_method_ = "proxy";
  } else if (!netem_missing_ && link.delay_ms > 0) {
    delay_method_ = "netem";
  }
  common::Log(
      "network: %d hosts on %s0/24, each link %s%s", servers + workers,
      data_net, link.text,
      delay_method_ == "proxy"
          ? absl::StrCat(" (rate with tbf; no netem, so a delay proxy on each "
                         "worker's host adds ",
                         placement_.proxy_delay_ms, " ms each way per server)")
          : "");
  return absl::OkStatus();
}

absl::Status EmulatedNetwork::TearDown() {
  absl::Status first;
  // Deleting a namespace deletes the veth ends inside, and so their peers.
  for (const std::string& ns : namespaces_) {
    absl::Status s = Ip({"netns", "del", ns});
    if (first.ok()) first = s;
  }
  namespaces_.clear();
  for (const std::string& bridge : bridges_) {
    absl::Status s = Ip({"link", "del", bridge});
    if (first.ok()) first = s;
  }
  bridges_.clear();
  return first;
}

EmulatedNetwork::~EmulatedNetwork() {
  absl::Status status = TearDown();
  if (!status.ok()) {
    common::Log("network: teardown incomplete: %s", status.ToString());
  }
}

}  // namespace monsoon::tools
