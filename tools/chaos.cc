#include "tools/chaos.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/match.h"
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
      "stop:server0@5s+10s, add:worker@10s, remove:worker1@20s)"));
}

const char* Names(Fault::Kind kind) {
  switch (kind) {
    case Fault::Kind::kKill:
      return "kill";
    case Fault::Kind::kStop:
      return "stop";
    case Fault::Kind::kAdd:
      return "add";
    case Fault::Kind::kRemove:
      return "remove";
  }
  return "fault";
}

}  // namespace

std::string Fault::target() const {
  return absl::StrCat(server ? "server " : "worker ", index);
}

int RanksFor(const std::vector<Fault>& faults, int workers) {
  int ranks = workers;
  for (const Fault& fault : faults) {
    if (fault.kind == Fault::Kind::kAdd) ++ranks;
  }
  return ranks;
}

absl::StatusOr<WorkerCount> ParseWorkerCount(absl::string_view text,
                                             bool elastic) {
  const std::vector<absl::string_view> parts = absl::StrSplit(text, ':');
  WorkerCount count;
  if (parts.size() > 2 || !absl::SimpleAtoi(parts[0], &count.start) ||
      (parts.size() == 2 && !absl::SimpleAtoi(parts[1], &count.max))) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--workers='", text,
        "': give a count such as 4, or in an elastic run MIN:MAX such as 2:6 "
        "(start MIN, let the run grow to MAX)"));
  }
  if (count.start < 1 || count.start > 256 ||
      (parts.size() == 2 && (count.max < 1 || count.max > 256))) {
    return absl::InvalidArgumentError(
        absl::StrCat("--workers='", text, "': counts must be in [1, 256]"));
  }
  if (parts.size() == 2 && !elastic) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--workers=", text,
        " gives the most workers an elastic run may have: add --elastic, or "
        "give one count"));
  }
  if (parts.size() == 2 && count.max < count.start) {
    return absl::InvalidArgumentError(
        absl::StrCat("--workers=", text, ": MAX is below MIN (the ", count.start,
                     " workers started are ranks of the run)"));
  }
  return count;
}

absl::StatusOr<int> RanksFor(const std::vector<Fault>& faults,
                             const WorkerCount& count) {
  const int needed = RanksFor(faults, count.start);
  if (count.max == 0) return needed;
  if (needed > count.max) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--chaos adds ", needed - count.start, " workers to the ", count.start,
        " started: more than --workers=", count.start, ":", count.max,
        " lets the run have; raise MAX or drop an add"));
  }
  return count.max;
}

absl::StatusOr<std::vector<Fault>> ParseChaos(absl::string_view spec,
                                              int servers, int workers,
                                              bool elastic) {
  std::vector<Fault> faults;
  int adds = 0;
  for (absl::string_view part : absl::StrSplit(spec, ',', absl::SkipEmpty())) {
    part = absl::StripAsciiWhitespace(part);
    Fault fault;
    fault.text = std::string(part);
    absl::string_view rest = part;
    if (absl::ConsumePrefix(&rest, "kill:")) {
      fault.kind = Fault::Kind::kKill;
    } else if (absl::ConsumePrefix(&rest, "stop:")) {
      fault.kind = Fault::Kind::kStop;
    } else if (absl::ConsumePrefix(&rest, "add:")) {
      fault.kind = Fault::Kind::kAdd;
    } else if (absl::ConsumePrefix(&rest, "remove:")) {
      fault.kind = Fault::Kind::kRemove;
    } else {
      return Invalid(part, "the action must be kill, stop, add or remove");
    }
    const bool membership = fault.kind == Fault::Kind::kAdd ||
                            fault.kind == Fault::Kind::kRemove;
    if (membership && !elastic) {
      return Invalid(part,
                     "workers join and leave only an elastic run (--elastic)");
    }
    const size_t at = rest.find('@');
    if (at == absl::string_view::npos) {
      return Invalid(part, "no @TIME");
    }
    absl::string_view target = rest.substr(0, at);
    absl::string_view when = rest.substr(at + 1);
    int count = 0;
    if (fault.kind == Fault::Kind::kAdd) {
      if (target != "worker") {
        return Invalid(part, "add starts a worker: write add:worker@TIME");
      }
      fault.server = false;
      fault.index = workers + adds++;
    } else if (membership && !absl::StartsWith(target, "worker")) {
      return Invalid(part, "remove takes a worker away: write "
                           "remove:workerN@TIME");
    }
    if (fault.kind == Fault::Kind::kAdd) {
      // The rank is the next one free.
    } else if (absl::ConsumePrefix(&target, "server")) {
      fault.server = true;
      count = servers;
    } else if (absl::ConsumePrefix(&target, "worker")) {
      fault.server = false;
      count = workers;
    } else {
      return Invalid(part, "the target must be serverN or workerN");
    }
    if (fault.kind != Fault::Kind::kAdd &&
        (!absl::SimpleAtoi(target, &fault.index) || fault.index < 0 ||
         fault.index >= count)) {
      if (!fault.server && elastic && fault.index >= count) {
        // Checked below, once the adds are known.
      } else {
        return Invalid(part, absl::StrCat("this run has ", count, " ",
                                          fault.server ? "servers" : "workers",
                                          ", numbered from 0"));
      }
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
      return Invalid(part, absl::StrCat("a ", Names(fault.kind),
                                        " takes no duration"));
    }
    faults.push_back(std::move(fault));
  }
  std::stable_sort(
      faults.begin(), faults.end(),
      [](const Fault& a, const Fault& b) { return a.at_s < b.at_s; });
  if (!elastic) return faults;
  // In time order: the workers a remove or a kill takes away are there,
  // and one stays.
  std::vector<bool> up(workers + adds, false);
  for (int r = 0; r < workers; ++r) up[r] = true;
  int live = workers;
  for (const Fault& fault : faults) {
    if (fault.server) continue;
    if (fault.kind == Fault::Kind::kAdd) {
      up[fault.index] = true;
      ++live;
      continue;
    }
    if (fault.index >= static_cast<int>(up.size())) {
      return Invalid(fault.text,
                     absl::StrCat("this run has ranks 0 to ", up.size() - 1,
                                  " (", workers, " at the start and ", adds,
                                  " added)"));
    }
    if (fault.kind == Fault::Kind::kStop) continue;
    if (!up[fault.index]) {
      return Invalid(fault.text, absl::StrCat("worker ", fault.index,
                                              " is not in the run by then"));
    }
    if (live == 1) {
      return Invalid(fault.text,
                     "it would take the run's last worker away, and the "
                     "data left would never be trained");
    }
    up[fault.index] = false;
    --live;
  }
  return faults;
}

}  // namespace monsoon::tools
