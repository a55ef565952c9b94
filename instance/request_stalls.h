// The requests each rank's watchdog found stalled, in the control segment,
// for kvrelay-dump: requests that have not finished long after their final
// chunk was signalled on that rank, or that ended with transfers still in
// flight (worker/send_scheduler.h, find_stalls()). The worker logs each one
// too; this board is what an operator sees without the logs.
//
// One writer per rank (its worker), any number of readers. A rank's list is
// rewritten whole under a sequence lock (odd while being rewritten), word by
// word through relaxed atomics, so a reader never mixes two lists and no
// byte is read while another process writes it.
#pragma once

#include <atomic>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "instance/instance_config.h"

namespace kvrelay {

// Listed per rank; the rest are counted.
inline constexpr uint32_t kStallsShown = 8;

enum class StallReason : uint32_t {
  kNoDecodeHalf = 1,       // its CacheDest has not arrived
  kTransfersInFlight = 2,  // the transport has not completed its transfers
  kWithdrawing = 3,        // it ended (failed, cancelled); its transfers are still in flight
};
// "waiting for its CacheDest (the decode half)", ...
const char* stall_reason_text(StallReason reason);
// "no_decode_half", ... (for --json and labels)
const char* stall_reason_name(StallReason reason);

struct StallRecord {
  uint64_t since_ns = 0;   // CLOCK_MONOTONIC: its final chunk was signalled, or it ended
  uint32_t slot = 0;       // the engine slot
  uint32_t reason = 0;     // StallReason
  uint32_t in_flight = 0;  // transfers
  uint32_t reserved = 0;
  char request_id[96] = {};  // NUL-terminated; cut when longer
  char peer[64] = {};        // where its transfers go; NUL-terminated, cut when longer
};
static_assert(sizeof(StallRecord) % 8 == 0);

struct alignas(64) RankStalls {
  static constexpr size_t kRecordWords = sizeof(StallRecord) / 8;
  std::atomic<uint32_t> sequence;  // odd while being rewritten
  std::atomic<uint32_t> shown;     // records listed below
  std::atomic<uint64_t> stalled;   // stalled now, listed or not
  std::atomic<uint64_t> records[kStallsShown][kRecordWords];
};

struct StallBoard {
  RankStalls ranks[kMaxTpSize];
};

namespace request_stalls {

// Writer (rank's worker): the stalled requests now; the first kStallsShown
// of `stalled` are listed.
void publish(RankStalls& board, std::span<const StallRecord> stalled);

struct Snapshot {
  uint64_t stalled = 0;
  std::vector<StallRecord> shown;
};
// Readers: a consistent copy, or nullopt when the writer kept rewriting it.
std::optional<Snapshot> read(const RankStalls& board);

// Copies `text` into a record's fixed field, cut to fit, NUL-terminated.
template <size_t N>
void set_text(char (&field)[N], std::string_view text) {
  const size_t n = text.size() < N - 1 ? text.size() : N - 1;
  for (size_t i = 0; i < n; ++i)
    field[i] = text[i];
  field[n] = '\0';
}
// The text of a fixed field (bounded: a field without a NUL is cut at its end).
template <size_t N>
std::string text_of(const char (&field)[N]) {
  size_t n = 0;
  while (n < N && field[n] != '\0')
    ++n;
  return std::string(field, n);
}

}  // namespace request_stalls
}  // namespace kvrelay
