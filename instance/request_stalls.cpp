#include "instance/request_stalls.h"

#include <algorithm>
#include <cstring>

namespace kvrelay {

const char* stall_reason_text(StallReason reason) {
  switch (reason) {
    case StallReason::kNoDecodeHalf: return "waiting for its CacheDest (the decode half)";
    case StallReason::kTransfersInFlight: return "waiting for transfers in flight";
    case StallReason::kWithdrawing:
      return "ended, and waiting for its transfers in flight before it reports";
  }
  return "unknown";
}

const char* stall_reason_name(StallReason reason) {
  switch (reason) {
    case StallReason::kNoDecodeHalf: return "no_decode_half";
    case StallReason::kTransfersInFlight: return "transfers_in_flight";
    case StallReason::kWithdrawing: return "withdrawing";
  }
  return "unknown";
}

namespace request_stalls {

void publish(RankStalls& board, std::span<const StallRecord> stalled) {
  const uint32_t shown =
      stalled.size() < kStallsShown ? static_cast<uint32_t>(stalled.size()) : kStallsShown;
  const uint32_t seq = board.sequence.load(std::memory_order_relaxed);
  board.sequence.store(seq + 1, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_release);  // odd before any word changes
  for (uint32_t i = 0; i < shown; ++i) {
    uint64_t words[RankStalls::kRecordWords];
    std::memcpy(words, &stalled[i], sizeof(words));
    for (size_t w = 0; w < RankStalls::kRecordWords; ++w)
      board.records[i][w].store(words[w], std::memory_order_relaxed);
  }
  board.shown.store(shown, std::memory_order_relaxed);
  board.stalled.store(stalled.size(), std::memory_order_relaxed);
  board.sequence.store(seq + 2, std::memory_order_release);
}

std::optional<Snapshot> read(const RankStalls& board) {
  for (int attempt = 0; attempt < 100; ++attempt) {
    const uint32_t before = board.sequence.load(std::memory_order_acquire);
    if (before % 2 != 0) continue;
    Snapshot s;
    s.stalled = board.stalled.load(std::memory_order_relaxed);
    const uint32_t shown = std::min(board.shown.load(std::memory_order_relaxed), kStallsShown);
    s.shown.resize(shown);
    for (uint32_t i = 0; i < shown; ++i) {
      uint64_t words[RankStalls::kRecordWords];
      for (size_t w = 0; w < RankStalls::kRecordWords; ++w)
        words[w] = board.records[i][w].load(std::memory_order_relaxed);
      std::memcpy(&s.shown[i], words, sizeof(words));
    }
    std::atomic_thread_fence(std::memory_order_acquire);  // the copy before the re-check
    if (board.sequence.load(std::memory_order_relaxed) == before) return s;
  }
  return std::nullopt;
}

}  // namespace request_stalls
}  // namespace kvrelay
