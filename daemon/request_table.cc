// One owner of request state: see request_table.h.
#include "hisparse/daemon/request_table.h"

#include <atomic>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"

namespace hisparse {

const char* RequestStateName(RequestState state) {
  switch (state) {
    case RequestState::kLive:
      return "live";
    case RequestState::kParked:
      return "parked";
    case RequestState::kImporting:
      return "importing";
    case RequestState::kOrphaned:
      return "orphaned";
  }
  return "unknown";
}

uint64_t RequestEntry::PageCount() const {
  uint64_t n = 0;
  for (const auto& layer : pages) n += layer.size();
  return n;
}

uint64_t RequestEntry::NewGeneration() {
  static std::atomic<uint64_t> next{1};
  return next.fetch_add(1, std::memory_order_relaxed);
}

RequestTable RequestTable::Open(AdmissionLedger* ledger, uint64_t session_id, uint32_t tenant, uint32_t rows,
                                uint64_t arena_bytes) {
  ledger->AddSession(session_id, tenant, rows, arena_bytes);
  return RequestTable(ledger, session_id);
}

RequestTable::RequestTable(RequestTable&& other) noexcept
    : ledger_(std::exchange(other.ledger_, nullptr)),
      session_id_(std::exchange(other.session_id_, 0)),
      orphan_(std::exchange(other.orphan_, false)),
      requests_(std::move(other.requests_)) {
  other.requests_.clear();
}

RequestTable& RequestTable::operator=(RequestTable&& other) noexcept {
  if (this != &other) {
    ledger_ = std::exchange(other.ledger_, nullptr);
    session_id_ = std::exchange(other.session_id_, 0);
    orphan_ = std::exchange(other.orphan_, false);
    requests_ = std::move(other.requests_);
    other.requests_.clear();
  }
  return *this;
}

RequestEntry* RequestTable::Find(uint64_t id) {
  auto it = requests_.find(id);
  return it == requests_.end() ? nullptr : &it->second;
}

const RequestEntry* RequestTable::Find(uint64_t id) const {
  auto it = requests_.find(id);
  return it == requests_.end() ? nullptr : &it->second;
}

size_t RequestTable::Count(RequestState state) const {
  size_t n = 0;
  for (const auto& [id, r] : requests_) n += r.state_ == state ? 1 : 0;
  return n;
}

std::vector<uint64_t> RequestTable::Ids() const {
  std::vector<uint64_t> ids;
  ids.reserve(requests_.size());
  for (const auto& [id, r] : requests_) ids.push_back(id);
  return ids;
}

absl::Status RequestTable::WrongState(const RequestEntry& r, const char* transition) const {
  return absl::InternalError(absl::StrCat("request ", r.id, " of session ", session_id_, " is ",
                                          RequestStateName(r.state_), ": no ", transition, " from there"));
}

RequestEntry& RequestTable::Admit(RequestEntry r, uint32_t row) {
  r.state_ = RequestState::kLive;
  r.row_ = row;
  r.import_grant_.clear();
  ledger_->Admit(session_id_, r.id, row, r.charged_pages);
  const uint64_t id = r.id;
  return requests_.insert_or_assign(id, std::move(r)).first->second;
}

absl::Status RequestTable::BeginImport(RequestEntry& r, std::string grant_id) {
  if (r.state_ != RequestState::kLive) return WrongState(r, "import");
  r.state_ = RequestState::kImporting;
  r.import_grant_ = std::move(grant_id);
  return absl::OkStatus();
}

absl::Status RequestTable::CommitImport(RequestEntry& r) {
  if (r.state_ != RequestState::kImporting) return WrongState(r, "commit");
  r.state_ = RequestState::kLive;
  r.import_grant_.clear();
  ledger_->Touch(session_id_, r.id);
  return absl::OkStatus();
}

absl::Status RequestTable::Park(RequestEntry& r) {
  if (r.state_ != RequestState::kLive) return WrongState(r, "park");
  ledger_->Park(session_id_, r.id);
  r.state_ = RequestState::kParked;
  return absl::OkStatus();
}

absl::Status RequestTable::Resume(RequestEntry& r, uint32_t row) {
  if (r.state_ != RequestState::kParked) return WrongState(r, "resume");
  ledger_->Resume(session_id_, r.id, row);
  r.state_ = RequestState::kLive;
  r.row_ = row;
  return absl::OkStatus();
}

void RequestTable::Erase(uint64_t id) {
  if (ledger_ != nullptr) ledger_->Release(session_id_, id);
  requests_.erase(id);
}

absl::Status RequestTable::Orphan() {
  for (const auto& [id, r] : requests_) {
    if (r.state_ != RequestState::kLive && r.state_ != RequestState::kParked) return WrongState(r, "orphaning");
  }
  for (auto& [id, r] : requests_) r.state_ = RequestState::kOrphaned;
  ledger_->OrphanSession(session_id_);  // parks them there too
  orphan_ = true;
  return absl::OkStatus();
}

absl::Status RequestTable::AdoptFrom(RequestTable& orphan) {
  if (!orphan.orphan_ || orphan_ || orphan.ledger_ != ledger_) {
    return absl::InternalError(absl::StrCat("session ", session_id_, " cannot adopt session ", orphan.session_id_,
                                            ": not an orphan and a live session of one ledger"));
  }
  for (const auto& [id, r] : orphan.requests_) {
    if (r.state_ != RequestState::kOrphaned) return orphan.WrongState(r, "adoption");
    if (requests_.contains(id)) {
      return absl::InternalError(
          absl::StrCat("request ", id, " of orphan ", orphan.session_id_, " is already one of session ", session_id_));
    }
  }
  ledger_->AdoptOrphan(orphan.session_id_, session_id_);
  for (auto& [id, r] : orphan.requests_) {
    r.state_ = RequestState::kParked;
    requests_.emplace(id, std::move(r));
  }
  orphan.requests_.clear();
  orphan.ledger_ = nullptr;
  orphan.orphan_ = false;
  return absl::OkStatus();
}

void RequestTable::Close() {
  if (ledger_ != nullptr) ledger_->RemoveSession(session_id_);
  requests_.clear();
  ledger_ = nullptr;
  orphan_ = false;
}

absl::Status RequestTable::CheckInvariants() const {
  if (ledger_ == nullptr) {
    if (!requests_.empty()) return absl::InternalError("an unbound request table holds requests");
    return absl::OkStatus();
  }
  if (!ledger_->HasSession(session_id_)) {
    return absl::InternalError(absl::StrCat("session ", session_id_, " is not in the ledger"));
  }
  if (ledger_->IsOrphan(session_id_) != orphan_) {
    return absl::InternalError(
        absl::StrCat("session ", session_id_, (orphan_ ? " is" : " is not"), " an orphan, the ledger says otherwise"));
  }
  for (const auto& [id, r] : requests_) {
    if (r.id != id) return absl::InternalError(absl::StrCat("request ", r.id, " is filed under id ", id));
    if ((r.state_ == RequestState::kOrphaned) != orphan_) {
      return absl::InternalError(absl::StrCat("session ", session_id_, " request ", id, " is ",
                                              RequestStateName(r.state_), (orphan_ ? " in an orphan" : "")));
    }
    if (r.import_grant_.empty() == (r.state_ == RequestState::kImporting)) {
      return absl::InternalError(absl::StrCat("session ", session_id_, " request ", id, " is ",
                                              RequestStateName(r.state_), " with", r.import_grant_.empty() ? "out" : "",
                                              " a grant"));
    }
    const std::optional<uint32_t> ledger_row = ledger_->RowOf(session_id_, id);
    const bool row_agrees =
        HoldsRow(r.state_) ? ledger_row.has_value() && *ledger_row == r.row_ : !ledger_row.has_value();
    if (!ledger_->HasRequest(session_id_, id) || !row_agrees ||
        ledger_->IsParked(session_id_, id) != !HoldsRow(r.state_)) {
      return absl::InternalError(absl::StrCat("session ", session_id_, " request ", id, " (",
                                              RequestStateName(r.state_), "): row disagrees with the ledger"));
    }
  }
  return absl::OkStatus();
}

Reservation::Reservation(Reservation&& other) noexcept
    : source_(other.source_),
      owner_(other.owner_),
      rows_(std::move(other.rows_)),
      pages_(std::exchange(other.pages_, {})) {}

Reservation& Reservation::operator=(Reservation&& other) noexcept {
  if (this != &other) {
    Release();
    source_ = other.source_;
    owner_ = other.owner_;
    rows_ = std::move(other.rows_);
    pages_ = std::exchange(other.pages_, {});
  }
  return *this;
}

Reservation::~Reservation() { Release(); }

void Reservation::Release() {
  if (pages_.empty()) return;
  // Pages the source gave this owner a moment ago: giving them back fails only on an accounting
  // error, which the source's and the manager's invariant checks report.
  (void)source_->ReleaseAll(owner_, pages_);
  pages_.clear();
}

std::optional<Refusal> CheckReserve(const AdmissionLedger& ledger, const ReserveSpec& spec, std::vector<uint32_t>* rows,
                                    int* failed_row) {
  const auto requests = static_cast<uint32_t>(spec.row_sessions.size());
  if (std::optional<Refusal> refusal = ledger.CheckGrow(spec.charged_session, spec.pages, requests)) return refusal;
  for (size_t i = 0; i < spec.row_sessions.size(); ++i) {
    uint32_t row = 0;
    if (std::optional<Refusal> refusal = ledger.FreeRow(spec.row_sessions[i], &row)) {
      if (failed_row != nullptr) *failed_row = static_cast<int>(i);
      return refusal;
    }
    if (rows != nullptr) rows->push_back(row);
  }
  return std::nullopt;
}

ReserveOutcome Reserve(const AdmissionLedger& ledger, PageSource& source, const ReserveSpec& spec,
                       absl::StatusOr<std::vector<PagePool::Page>>* taken) {
  ReserveOutcome out;
  const auto refuse = [&out](Refusal refusal) {
    out.status = std::move(refusal.status);
    out.counted = refusal.reason;
    return std::move(out);
  };
  // Pages taken beforehand are the reservation's from here: a refusal below gives them back.
  Reservation held(&source, spec.owner);
  if (taken != nullptr && taken->ok()) held.pages_ = std::move(**taken);
  if (std::optional<Refusal> refusal = CheckReserve(ledger, spec, &held.rows_, &out.failed_row)) {
    return refuse(*std::move(refusal));
  }
  if (spec.pages != 0) {
    if (spec.pages > UINT32_MAX) {
      out.lacked_room = true;
      return refuse({RejectReason::kPoolFull, absl::ResourceExhaustedError(absl::StrCat(
                                                  "a request of ", spec.pages, " pages exceeds any host pool"))});
    }
    absl::Status room;  // the pages' own answer: taken beforehand, or allocated now
    if (taken != nullptr) {
      room = taken->status();
    } else if (absl::StatusOr<std::vector<PagePool::Page>> pages =
                   source.Allocate(spec.owner, static_cast<uint32_t>(spec.pages), nullptr);
               pages.ok()) {
      held.pages_ = *std::move(pages);
    } else {
      room = pages.status();
    }
    if (!room.ok()) {
      if (!absl::IsResourceExhausted(room)) {
        out.status = room;  // not a refusal: an error of the pool's
        return out;
      }
      out.lacked_room = true;
      return refuse({RejectReason::kPoolFull, room});
    }
  }
  out.reservation = std::move(held);
  return out;
}

}  // namespace hisparse
