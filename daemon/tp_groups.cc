// TP groups' membership: see tp_groups.h.
#include "hisparse/daemon/tp_groups.h"

#include <algorithm>
#include <optional>
#include <string>

#include "absl/strings/str_cat.h"
#include "hisparse/common/log.h"
#include "hisparse/common/status_macros.h"
#include "hisparse/daemon/deferred_log.h"

namespace hisparse {
namespace {

constexpr uint32_t kMaxGroupSize = 64;
constexpr size_t kMaxGroupName = 128;

bool IsUtf8(absl::string_view text) {
  for (size_t i = 0; i < text.size();) {
    const auto c = static_cast<uint8_t>(text[i]);
    const size_t n = c < 0x80 ? 1 : (c & 0xe0) == 0xc0 ? 2 : (c & 0xf0) == 0xe0 ? 3 : (c & 0xf8) == 0xf0 ? 4 : 0;
    if (n == 0 || i + n > text.size()) return false;
    for (size_t j = 1; j < n; ++j) {
      if ((static_cast<uint8_t>(text[i + j]) & 0xc0) != 0x80) return false;
    }
    i += n;
  }
  return true;
}

}  // namespace

absl::Status TpGroups::Validate(const v1::TpGroup& g) {
  if (g.name().empty() || g.name().size() > kMaxGroupName || !IsUtf8(g.name())) {
    return absl::InvalidArgumentError(
        absl::StrCat("group.name must be 1..", kMaxGroupName, " bytes of UTF-8, got ", g.name().size(), " bytes"));
  }
  if (g.size() < 1 || g.size() > kMaxGroupSize) {
    return absl::InvalidArgumentError(
        absl::StrCat("group.size must be 1..", kMaxGroupSize, ", got ", g.size(), " (group \"", g.name(), "\")"));
  }
  if (g.rank() >= g.size()) {
    return absl::InvalidArgumentError(absl::StrCat("group.rank must be below group.size (", g.size(), "), got ",
                                                   g.rank(), " (group \"", g.name(), "\")"));
  }
  return absl::OkStatus();
}

absl::Status TpGroups::CheckJoin(const SessionEntry& s, const v1::TpGroup& g, uint32_t max_context) const {
  // Names are the tenant's own: another uid's group of this name is another group, unseen here.
  auto it = groups_.find(Key{s.tenant_uid, g.name()});
  if (it == groups_.end()) return absl::OkStatus();
  const TpGroup& group = it->second;
  const std::string name = absl::StrCat("group \"", g.name(), "\"");
  if (group.ranks.size() != g.size()) {
    return absl::FailedPreconditionError(
        absl::StrCat(name, " has size ", group.ranks.size(), "; this session says group.size ", g.size()));
  }
  auto differs = [&](const char* field, uint32_t theirs, uint32_t mine) {
    return absl::FailedPreconditionError(absl::StrCat(name, "'s members have geometry.", field, " ", theirs,
                                                      "; this session has ", mine, ": a group's pages are one layout"));
  };
  if (group.num_layers != s.geometry.num_layers())
    return differs("num_layers", group.num_layers, s.geometry.num_layers());
  if (group.record_bytes != s.geometry.record_bytes())
    return differs("record_bytes", group.record_bytes, s.geometry.record_bytes());
  if (group.max_context_tokens != max_context)
    return differs("max_context_tokens", group.max_context_tokens, max_context);
  if (group.ranks[g.rank()] != 0) {
    return absl::AlreadyExistsError(
        absl::StrCat(name, " rank ", g.rank(), " is held by live session ", group.ranks[g.rank()]));
  }
  return absl::OkStatus();
}

absl::Status TpGroups::Join(SessionEntry& s, const v1::TpGroup& g, uint32_t max_context, uint64_t* next_id) {
  HS_RETURN_IF_ERROR(CheckJoin(s, g, max_context));
  auto [it, created] = groups_.try_emplace(Key{s.tenant_uid, g.name()});
  TpGroup& group = it->second;
  if (created) {
    group.owner = (*next_id)++;
    group.tenant_uid = s.tenant_uid;
    group.num_layers = s.geometry.num_layers();
    group.record_bytes = s.geometry.record_bytes();
    group.max_context_tokens = max_context;
    group.ranks.assign(g.size(), 0);
  }
  group.ranks[g.rank()] = s.id;
  s.group = g.name();
  s.group_rank = g.rank();
  return absl::OkStatus();
}

std::optional<uint64_t> TpGroups::Leave(const SessionEntry& s) {
  if (s.group.empty()) return std::nullopt;
  auto it = groups_.find(KeyOf(s));
  if (it == groups_.end()) return std::nullopt;
  TpGroup& group = it->second;
  if (s.group_rank < group.ranks.size() && group.ranks[s.group_rank] == s.id) group.ranks[s.group_rank] = 0;
  if (std::any_of(group.ranks.begin(), group.ranks.end(), [](uint64_t id) { return id != 0; })) {
    return std::nullopt;
  }
  // The last member: its shares were released first, so the group holds no page now.
  if (!group.requests.empty()) LOCKED_LOG(ERROR) << "group \"" << s.group << "\" ends holding requests";
  const uint64_t owner = group.owner;
  groups_.erase(it);
  return owner;
}

TpGroup* TpGroups::Find(const SessionEntry& s) {
  auto it = groups_.find(KeyOf(s));
  return it == groups_.end() ? nullptr : &it->second;
}

const TpGroup* TpGroups::Find(const SessionEntry& s) const {
  auto it = groups_.find(KeyOf(s));
  return it == groups_.end() ? nullptr : &it->second;
}

bool TpGroups::IsOwner(uint64_t owner) const {
  for (const auto& [key, group] : groups_) {
    if (group.owner == owner) return true;
  }
  return false;
}

void TpGroups::FillInfo(const SessionEntry& s, const RequestEntry& r, v1::RequestInfo* info) const {
  info->set_group(s.group);
  auto git = groups_.find(KeyOf(s));
  if (git == groups_.end()) return;
  auto hit = git->second.requests.find(r.id);
  if (hit == git->second.requests.end()) return;
  const auto holders = static_cast<uint32_t>(hit->second.holders.size());
  info->set_group_holders(holders);
  info->set_shared_bytes(holders > 1 ? info->host_bytes() : 0);
}

}  // namespace hisparse
