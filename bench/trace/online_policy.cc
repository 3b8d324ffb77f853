// Online replacement policies over RESOLVE's slot mechanics (stream_internal.h): LRU, hint-aware
// LRU and LRU-2.
//
// State per stream: `order_`, the B regular slots least recently used first, each holding a
// position or kEmpty (ResetRowReference leaves every slot empty, in slot order; empty slots are
// never touched, so they stay at the front until used), and per-position flags. A step:
//  1. Selections: seq_len - 1 is the newest token, a hit that marks nothing (rule 1). Every other
//     selected position is a hit when resident, else a miss, in selection order.
//  2. Victims: `misses` slots among those that hold no hit, chosen by the policy; miss i takes
//     victim i (rule 2 for kLru).
//  3. New order: untouched slots (old order), then the victims in miss order, then the hit slots
//     (old order) (rule 3). Hints never change the order, only which slots are victims.
// With kLru this is RESOLVE's reference step for step; trace_replay_test holds the two equal.
#include <algorithm>
#include <limits>
#include <tuple>
#include <utility>

#include "stream_internal.h"

namespace hisparse::trace::internal {
namespace {

constexpr int32_t kEmpty = -1;
constexpr uint8_t kResident = 1, kSelected = 2, kHinted = 4;

class OnlineReplayer {
 public:
  OnlineReplayer(const Stream& s, int32_t slots, OnlineVictims victims, int32_t hint_depth)
      : victims_(victims), hint_depth_(hint_depth), order_(slots, kEmpty) {
    int32_t max_len = 1;
    ForEachRecord(s, [&](const RecordView& r) { max_len = std::max(max_len, r.seq_len); });
    flags_.assign(max_len, 0);
    if (victims_ == OnlineVictims::kLru2) {
      last_.assign(max_len, kNever);
      second_.assign(max_len, kNever);
    }
  }

  // One record: returns its misses and adds to *c.
  uint32_t Step(const RecordView& r, ReplayCounts* c) {
    c->selections += r.n;
    misses_.clear();
    for (int32_t j = 0; j < r.n; ++j) {
      const int32_t p = r.positions[j];
      if (p == r.seq_len - 1) {
        ++c->hits;
        continue;
      }
      flags_[p] |= kSelected;
      if (flags_[p] & kResident) {
        ++c->hits;
      } else {
        misses_.push_back(p);
      }
    }
    const int32_t depth = victims_ != OnlineVictims::kHint ? 0 : hint_depth_ < 0 ? r.m : std::min(hint_depth_, r.m);
    for (int32_t j = 0; j < depth; ++j) flags_[r.hints[j]] |= kHinted;

    ChooseVictims();
    Reorder();

    for (int32_t j = 0; j < depth; ++j) flags_[r.hints[j]] &= ~kHinted;
    for (int32_t j = 0; j < r.n; ++j) {
      const int32_t p = r.positions[j];
      if (p == r.seq_len - 1) continue;
      flags_[p] &= ~kSelected;
      if (victims_ == OnlineVictims::kLru2) {
        second_[p] = last_[p];
        last_[p] = r.index;
      }
    }
    c->misses += misses_.size();
    return static_cast<uint32_t>(misses_.size());
  }

 private:
  static constexpr int32_t kNever = std::numeric_limits<int32_t>::min();

  bool Evictable(int32_t i) const { return order_[i] == kEmpty || !(flags_[order_[i]] & kSelected); }
  bool Hinted(int32_t i) const { return order_[i] != kEmpty && (flags_[order_[i]] & kHinted); }

  // Fills victims_idx_ with misses_.size() indices into order_, in the order misses take them.
  void ChooseVictims() {
    victim_idx_.clear();
    const size_t need = misses_.size();
    const int32_t b = static_cast<int32_t>(order_.size());
    if (need == 0) return;
    switch (victims_) {
      case OnlineVictims::kLru:
        for (int32_t i = 0; i < b && victim_idx_.size() < need; ++i) {
          if (Evictable(i)) victim_idx_.push_back(i);
        }
        break;
      case OnlineVictims::kHint:
        for (int pass = 0; pass < 2; ++pass) {
          for (int32_t i = 0; i < b && victim_idx_.size() < need; ++i) {
            if (Evictable(i) && Hinted(i) == (pass == 1)) victim_idx_.push_back(i);
          }
        }
        break;
      case OnlineVictims::kLru2: {
        // LRU-2 (E. J. O'Neil, P. E. O'Neil, G. Weikum, "The LRU-K Page Replacement Algorithm for
        // Database Disk Buffering", SIGMOD 1993), with K = 2 and a step's selection as one
        // reference of each position it selects: the victim has the largest backward 2-distance,
        // i.e. the oldest second most recent selection; positions selected only once (distance
        // infinite) go first, ties by LRU order (the paper's subsidiary policy). History is kept
        // for every position of the stream, resident or not (an unbounded Retained Information
        // Period); no Correlated Reference Period (one step is one reference already).
        keyed_.clear();
        for (int32_t i = 0; i < b; ++i) {
          if (!Evictable(i)) continue;
          const int32_t p = order_[i];
          keyed_.emplace_back(p == kEmpty ? kNever : second_[p], i);
        }
        std::partial_sort(keyed_.begin(), keyed_.begin() + need, keyed_.end());
        for (size_t v = 0; v < need; ++v) victim_idx_.push_back(keyed_[v].second);
        break;
      }
    }
  }

  void Reorder() {
    const int32_t b = static_cast<int32_t>(order_.size());
    is_victim_.assign(b, 0);
    for (int32_t i : victim_idx_) is_victim_[i] = 1;
    next_.clear();
    for (int32_t i = 0; i < b; ++i) {
      if (!is_victim_[i] && Evictable(i)) next_.push_back(order_[i]);
    }
    for (size_t v = 0; v < victim_idx_.size(); ++v) {
      const int32_t old = order_[victim_idx_[v]];
      if (old != kEmpty) flags_[old] &= ~kResident;
      flags_[misses_[v]] |= kResident;
      next_.push_back(misses_[v]);
    }
    for (int32_t i = 0; i < b; ++i) {
      if (!Evictable(i)) next_.push_back(order_[i]);
    }
    order_.swap(next_);
  }

  const OnlineVictims victims_;
  const int32_t hint_depth_;
  std::vector<int32_t> order_;   // position per slot, least recently used first; kEmpty
  std::vector<uint8_t> flags_;   // [position] kResident | kSelected | kHinted
  std::vector<int32_t> last_;    // kLru2: [position] record index of its latest selection
  std::vector<int32_t> second_;  // kLru2: [position] of the one before (kNever: none)
  std::vector<int32_t> misses_, victim_idx_, next_;
  std::vector<char> is_victim_;
  std::vector<std::pair<int32_t, int32_t>> keyed_;  // kLru2: (second most recent selection, index)
};

}  // namespace

ReplayCounts ReplayOnline(const Stream& s, int32_t slots, OnlineVictims victims, int32_t hint_depth,
                          std::vector<uint32_t>* record_misses) {
  OnlineReplayer replayer(s, slots, victims, hint_depth);
  ReplayCounts c;
  ForEachRecord(s, [&](const RecordView& r) { record_misses->push_back(replayer.Step(r, &c)); });
  return c;
}

}  // namespace hisparse::trace::internal
