// Fixed binary records of the hot paths: layer signals (engine -> worker)
// and worker reports (worker -> coordinator). They travel on SPSC rings, one
// per rank, because the engine emits one per layer per step (often from a
// CUDA host callback, where building a Cap'n Proto message is not an option).
//
// Plain structs, trivially copyable, sized so that with the ring's 8-byte
// slot sequence each record fills whole cache lines. The sizes are also
// written into the instance configuration (signal_record_bytes,
// report_record_bytes), so attaching with a different build fails loudly.
#pragma once

#include <cstdint>
#include <cstring>
#include <string_view>
#include <type_traits>

#include "instance/instance_config.h"

namespace kvrelay::records {

// ---- Layer signals (DESIGN.md sections 4 and 5) -----------------------------

enum class SignalKind : uint32_t {
  // A step's batch: which slots prefill in this step and which tokens. A large
  // batch spans several records of the same step; all of them come before the
  // step's first layer record.
  kBatch = 1,
  // Layer `layer` of step `step` is computed for every slot of its batch.
  kLayerDone = 2,
  // Legacy per-query mode: (step, layer) is the newest computed position.
  kLegacyLayerDone = 3,
  // The layers of step `step`'s batch (the batch records just before) are
  // signalled by the GPU, not by records: layer l is done once the rank's
  // device signal word reaches device_base + l + 1. `count` layers.
  kDeviceLayers = 4,
};

struct BatchEntry {
  uint32_t slot;                // the engine's batch slot (CacheTask.engineSlot)
  uint32_t chunk_token_offset;  // tokens of this request prefilled before this chunk
  uint32_t chunk_len;           // tokens prefilled in this chunk
  // request_tag(request id) of the request in the slot, or 0 when the engine
  // cannot say. With it, signals that arrive before their CacheTask are
  // attributed exactly even if the slot is reused meanwhile; without it the
  // worker assumes a chunk at offset 0 starts a new request.
  uint32_t request_tag = 0;
};

inline constexpr uint32_t kBatchEntriesPerSignal = 6;

// A request id's 32-bit tag: FNV-1a, never 0.
constexpr uint32_t request_tag(std::string_view request_id) {
  uint32_t h = 2166136261U;
  for (char c : request_id) {
    h ^= static_cast<unsigned char>(c);
    h *= 16777619U;
  }
  return h == 0 ? 1 : h;
}

// An engine session's id: its submit-ring producer slot and the low bits of
// that slot's lease generation. 0: none.
constexpr uint32_t session_id(uint32_t slot, uint32_t generation) {
  return (slot << 16) | (generation & 0xFFFF);
}
constexpr uint32_t session_slot(uint32_t session) {
  return session >> 16;
}
constexpr uint16_t session_generation(uint32_t session) {
  return static_cast<uint16_t>(session);
}

struct LayerSignal {
  uint32_t kind;     // SignalKind
  uint32_t count;    // kBatch: entries used in this record
  uint64_t step;     // the engine's step; u64, never wraps
  uint32_t layer;    // kLayerDone / kLegacyLayerDone
  uint32_t session;  // session_id() of the pushing client (stamped by the client library)
  union {
    BatchEntry entries[kBatchEntriesPerSignal] = {};  // kBatch
    uint64_t device_base;                             // kDeviceLayers
    // kLayerDone / kLegacyLayerDone: CLOCK_MONOTONIC ns when the engine
    // pushed it (the client library stamps it; 0: not stamped). Times the
    // engine -> worker hop; never affects what the signal does.
    uint64_t pushed_ns;
  };
};
static_assert(std::is_trivially_copyable_v<LayerSignal>);
// Whether a signal of kind `kind` has room for LayerSignal::pushed_ns.
constexpr bool carries_push_stamp(uint32_t kind) {
  return kind == static_cast<uint32_t>(SignalKind::kLayerDone) ||
         kind == static_cast<uint32_t>(SignalKind::kLegacyLayerDone);
}
static_assert(sizeof(LayerSignal) == kSignalRecordBytes,
              "120 bytes + 8-byte slot sequence = two cache lines");

// ---- Worker reports ---------------------------------------------------------

enum class ReportKind : uint32_t {
  kFinished = 1,   // the request's copies are done and fenced on this rank
  kFailed = 2,     // the request failed on this rank: `message` says why
  kCancelled = 3,  // the request was withdrawn on this rank
  kConnected = 4,  // connect task succeeded on this rank
  kConnectFailed = 5,
  kPoolRegistered = 6,
  kPoolRejected = 7,
};

// A report's reason reaches the engine whole: as long as a completion's own
// message may be (1 KiB), less the "rank N: " the coordinator puts first.
inline constexpr size_t kReportMessageBytes = 960;

struct WorkerReport {
  uint64_t handle;  // the coordinator's request handle (WorkerTask.handle)
  uint32_t kind;    // ReportKind
  uint32_t rank;
  uint64_t bytes_moved;  // bytes this rank copied for the request
  uint32_t layer;
  uint32_t reserved;
  uint64_t first_copy_ns;  // CLOCK_MONOTONIC when this rank began its first copy for it; 0: none
  uint64_t reported_ns;  // CLOCK_MONOTONIC when the worker wrote it (the coordinator times the hop)
  uint64_t reserved2;
  char message[kReportMessageBytes];  // NUL-terminated; empty unless failed

  // Longer texts are cut at a word boundary, saying so.
  void set_message(std::string_view text) {
    constexpr std::string_view kCut = " [cut]";
    size_t n = text.size();
    if (n > sizeof(message) - 1) {
      n = sizeof(message) - 1 - kCut.size();
      while (n > 0 && text[n] != ' ')
        --n;
      if (n == 0) n = sizeof(message) - 1 - kCut.size();
    }
    std::memcpy(message, text.data(), n);
    if (n < text.size()) {
      std::memcpy(message + n, kCut.data(), kCut.size());
      n += kCut.size();
    }
    message[n] = '\0';
  }
  // Never trusts the terminator: the record came from another process.
  std::string_view message_text() const {
    const void* end = std::memchr(message, 0, sizeof(message));
    return {message, end != nullptr ? static_cast<size_t>(static_cast<const char*>(end) - message)
                                    : sizeof(message)};
  }
};
static_assert(std::is_trivially_copyable_v<WorkerReport>);
static_assert(sizeof(WorkerReport) == kReportRecordBytes,
              "1016 bytes + 8-byte slot sequence = sixteen cache lines");

}  // namespace kvrelay::records
