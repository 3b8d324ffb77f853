#include "hisparse/keeper/notify_protocol.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace hisparse {

NotifyMessage ParseNotifyMessage(absl::string_view message) {
  NotifyMessage m;
  for (absl::string_view line : absl::StrSplit(message, '\n', absl::SkipEmpty())) {
    const size_t eq = line.find('=');
    if (eq == absl::string_view::npos) continue;
    const absl::string_view key = line.substr(0, eq);
    const absl::string_view value = line.substr(eq + 1);
    if (key == "FDSTORE") {
      m.fdstore = value == "1";
    } else if (key == "FDSTOREREMOVE") {
      m.fdstore_remove = value == "1";
    } else if (key == "BARRIER") {
      m.barrier = value == "1";
    } else if (key == "FDNAME") {
      m.fdname = std::string(value);
    }
  }
  return m;
}

absl::Status StoredFds::Add(std::string name, UniqueFd fd) {
  if (entries_.size() >= max_fds_) {
    return absl::ResourceExhaustedError(
        absl::StrCat("the store holds its maximum of ", max_fds_, " descriptors: ", name, " not stored"));
  }
  entries_.push_back(Entry{std::move(name), std::move(fd)});
  return absl::OkStatus();
}

size_t StoredFds::Remove(absl::string_view name) {
  const auto first = std::remove_if(entries_.begin(), entries_.end(), [&](const Entry& e) { return e.name == name; });
  const size_t removed = static_cast<size_t>(entries_.end() - first);
  entries_.erase(first, entries_.end());  // closes each
  return removed;
}

size_t StoredFds::count(absl::string_view name) const {
  return static_cast<size_t>(
      std::count_if(entries_.begin(), entries_.end(), [&](const Entry& e) { return e.name == name; }));
}

std::vector<std::string> StoredFds::names() const {
  std::vector<std::string> out;
  out.reserve(entries_.size());
  for (const Entry& e : entries_) out.push_back(e.name);
  return out;
}

std::vector<int> StoredFds::fds() const {
  std::vector<int> out;
  out.reserve(entries_.size());
  for (const Entry& e : entries_) out.push_back(e.fd.get());
  return out;
}

}  // namespace hisparse
