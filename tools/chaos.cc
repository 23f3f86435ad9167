#include "tools/chaos.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace monsoon::tools {
namespace {

// "10s", "2.5s" or "10" (seconds): a finite number >= 0.
bool ParseSeconds(absl::string_view text, double* seconds) {
  absl::ConsumeSuffix(&text, "s");
  return absl::SimpleAtod(text, seconds) && std::isfinite(*seconds) &&
         *seconds >= 0;
}

absl::Status Invalid(absl::string_view part, absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat(
      "--chaos: '", part, "': ", why,
      " (write ACTION:TARGET@TIME, e.g. kill:server1@10s, kill:worker0@20s, "
      "stop:server0@5s+10s)"));
}

}  // namespace

std::string Fault::target() const {
  return absl::StrCat(server ? "server " : "worker ", index);
}

absl::StatusOr<std::vector<Fault>> ParseChaos(absl::string_view spec,
                                              int servers, int workers) {
  std::vector<Fault> faults;
  for (absl::string_view part : absl::StrSplit(spec, ',', absl::SkipEmpty())) {
    part = absl::StripAsciiWhitespace(part);
    Fault fault;
    fault.text = std::string(part);
    absl::string_view rest = part;
    if (absl::ConsumePrefix(&rest, "kill:")) {
      fault.kind = Fault::Kind::kKill;
    } else if (absl::ConsumePrefix(&rest, "stop:")) {
      fault.kind = Fault::Kind::kStop;
    } else {
      return Invalid(part, "the action must be kill or stop");
    }
    const size_t at = rest.find('@');
    if (at == absl::string_view::npos) {
      return Invalid(part, "no @TIME");
    }
    absl::string_view target = rest.substr(0, at);
    absl::string_view when = rest.substr(at + 1);
    int count = 0;
    if (absl::ConsumePrefix(&target, "server")) {
      fault.server = true;
      count = servers;
    } else if (absl::ConsumePrefix(&target, "worker")) {
      fault.server = false;
      count = workers;
    } else {
      return Invalid(part, "the target must be serverN or workerN");
    }
    if (!absl::SimpleAtoi(target, &fault.index) || fault.index < 0 ||
        fault.index >= count) {
      return Invalid(part, absl::StrCat("this run has ", count, " ",
                                        fault.server ? "servers" : "workers",
                                        ", numbered from 0"));
    }
    std::vector<absl::string_view> times = absl::StrSplit(when, '+');
    if (times.size() > 2 || !ParseSeconds(times[0], &fault.at_s)) {
      return Invalid(part, "the time must be seconds >= 0, as in @10s");
    }
    if (fault.kind == Fault::Kind::kStop) {
      if (times.size() != 2 || !ParseSeconds(times[1], &fault.for_s) ||
          fault.for_s <= 0) {
        return Invalid(part, "a stop needs how long, as in @5s+10s");
      }
    } else if (times.size() != 1) {
      return Invalid(part, "a kill takes no duration");
    }
    faults.push_back(std::move(fault));
  }
  std::stable_sort(
      faults.begin(), faults.end(),
      [](const Fault& a, const Fault& b) { return a.at_s < b.at_s; });
  return faults;
}

}  // namespace monsoon::tools
