#include "server/sessions.h"

#include <string>

#include "absl/strings/str_cat.h"

namespace monsoon::server {

void Sessions::set_elastic(bool elastic) {
  absl::MutexLock lock(&mu_);
  elastic_ = elastic;
}

bool Sessions::IsLive(const Session& session, absl::Time now) const {
  if (session.id == 0 && session.last_contact == absl::InfinitePast()) {
    return !elastic_;  // never called
  }
  return !session.left && now - session.last_contact < lease_;
}

Sessions::Membership Sessions::membership() const {
  absl::MutexLock lock(&mu_);
  return membership_;
}

void Sessions::set_lease(absl::Duration lease) {
  absl::MutexLock lock(&mu_);
  lease_ = lease;
}

absl::Duration Sessions::lease() const {
  absl::MutexLock lock(&mu_);
  return lease_;
}

absl::Status Sessions::Open(int rank, uint64_t session, uint64_t replaces) {
  if (session == 0) {
    // 0 stands for "no session" (an unregistered rank, a call that carries
    // none): a registration with it would unbind the rank's holder and let
    // any caller act for the rank.
    return absl::InvalidArgumentError(absl::StrCat(
        "a registration of rank ", rank,
        " without a session id (RegisterRequest.session is 0): a worker "
        "draws a non-zero id at start and sends it with every call"));
  }
  const absl::Time now = absl::Now();
  absl::MutexLock lock(&mu_);
  Session& held = sessions_[rank];
  if (held.id != 0 && held.id != session && held.id != replaces &&
      now - held.last_contact < lease_) {
    const absl::Duration since =
        absl::Trunc(now - held.last_contact, absl::Milliseconds(100));
    return absl::AlreadyExistsError(absl::StrCat(
        "rank ", rank, " is held by another worker that called ",
        since == absl::ZeroDuration()
            ? std::string("just now")
            : absl::StrCat(absl::FormatDuration(since), " ago"),
        ": two workers started with --rank=", rank,
        "? (a restarted worker is let in once the other's lease of ",
        absl::FormatDuration(lease_), " has run out)"));
  }
  if (held.id == 0 || !IsLive(held, now)) {
    ++membership_.joins;
    ++membership_.epoch;
  }
  held.id = session;
  held.last_contact = now;
  held.left = false;
  held.lapse_reported = false;
  return absl::OkStatus();
}

absl::Status Sessions::Check(int rank, uint64_t session) const {
  absl::MutexLock lock(&mu_);
  auto it = sessions_.find(rank);
  if (it == sessions_.end() || it->second.id == 0 || it->second.id == session) {
    return absl::OkStatus();
  }
  return absl::PermissionDeniedError(absl::StrCat(
      "a call for rank ", rank,
      " from a process that does not hold the rank (another registered it "
      "since): two workers started with --rank=",
      rank, "?"));
}

void Sessions::End(int rank, uint64_t session) {
  absl::MutexLock lock(&mu_);
  auto it = sessions_.find(rank);
  if (it == sessions_.end() || it->second.id != session) return;
  if (!it->second.left && !it->second.lapse_reported) {
    ++membership_.leaves;
    ++membership_.epoch;
  }
  it->second.last_contact = absl::InfinitePast();
  it->second.left = true;
}

void Sessions::EndAsPrimaryDid(int rank, uint64_t session) {
  absl::MutexLock lock(&mu_);
  Session& held = sessions_[rank];
  held.id = session;
  held.last_contact = absl::InfinitePast();
  held.left = true;
  held.lapse_reported = false;
}

bool Sessions::HasLeft(int rank) const {
  absl::MutexLock lock(&mu_);
  auto it = sessions_.find(rank);
  return it != sessions_.end() && it->second.left;
}

void Sessions::Touch(int rank) {
  const absl::Time now = absl::Now();
  absl::MutexLock lock(&mu_);
  Session& session = sessions_[rank];
  // A call still under way from a process that left does not bring it back.
  if (!session.left) {
    if (session.lapse_reported) {
      ++membership_.joins;  // back after its lease ran out
      ++membership_.epoch;
    }
    session.last_contact = now;
    session.lapse_reported = false;
  }
}

void Sessions::Forgive(absl::Duration stall) {
  absl::MutexLock lock(&mu_);
  for (auto& [rank, session] : sessions_) {
    if (session.last_contact != absl::InfinitePast()) {
      session.last_contact += stall;
    }
  }
}

std::vector<std::pair<int, absl::Duration>> Sessions::NewlyLapsed(
    absl::Time now) {
  absl::MutexLock lock(&mu_);
  std::vector<std::pair<int, absl::Duration>> lapsed;
  for (auto& [rank, session] : sessions_) {
    if (session.id == 0 || session.left || session.lapse_reported ||
        session.last_contact == absl::InfinitePast() ||
        now - session.last_contact < lease_) {
      continue;
    }
    session.lapse_reported = true;
    ++membership_.leaves;
    ++membership_.epoch;
    lapsed.emplace_back(rank, now - session.last_contact);
  }
  return lapsed;
}

bool Sessions::Alive(int rank, absl::Time now) const {
  absl::MutexLock lock(&mu_);
  auto it = sessions_.find(rank);
  if (it == sessions_.end()) return !elastic_;
  return IsLive(it->second, now);
}

std::map<int, absl::Time> Sessions::LastContacts() const {
  absl::MutexLock lock(&mu_);
  std::map<int, absl::Time> contacts;
  for (const auto& [rank, session] : sessions_) {
    if (session.last_contact != absl::InfinitePast()) {
      contacts[rank] = session.last_contact;
    }
  }
  return contacts;
}

int Sessions::NumRegistered() const {
  absl::MutexLock lock(&mu_);
  int registered = 0;
  for (const auto& [rank, session] : sessions_) {
    if (session.id != 0 && !session.left) ++registered;
  }
  return registered;
}

absl::Duration Sessions::SinceContact(int rank, absl::Time now) const {
  absl::MutexLock lock(&mu_);
  auto it = sessions_.find(rank);
  if (it == sessions_.end()) return absl::InfiniteDuration();
  return now - it->second.last_contact;
}

std::vector<bool> Sessions::LiveRanks(int num_ranks, absl::Time now) const {
  absl::MutexLock lock(&mu_);
  std::vector<bool> live(num_ranks);
  for (int rank = 0; rank < num_ranks; ++rank) {
    auto it = sessions_.find(rank);
    // Live: never called (still starting), or called within the lease and
    // not left.
    live[rank] = it == sessions_.end() ? !elastic_ : IsLive(it->second, now);
  }
  return live;
}

}  // namespace monsoon::server
