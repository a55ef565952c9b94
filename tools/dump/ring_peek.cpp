#include "ring_peek.h"

#include <fmt/format.h>

#include <regex>

#include "schemas/codec.h"
#include "schemas/records.h"

namespace kvrelay::dump {

namespace {

// A copy of a payload in 8-byte-aligned memory, as capnp's reader wants.
std::vector<uint64_t> aligned(const std::vector<std::byte>& bytes) {
  std::vector<uint64_t> words((bytes.size() + 7) / 8);
  if (!bytes.empty()) std::memcpy(words.data(), bytes.data(), bytes.size());
  return words;
}

template <class T>
std::string render(std::span<const std::byte> payload) {
  std::string out;
  Status s = messages::with_message<T>(payload, [&](typename T::Reader r) -> Status {
    out = kj::str(r).cStr();
    return {};
  });
  return s ? out : "<" + s.error().message + ">";
}

std::string render_record(int32_t type, const std::vector<std::byte>& payload) {
  const auto words = aligned(payload);
  const std::span<const std::byte> p(reinterpret_cast<const std::byte*>(words.data()),
                                     payload.size());
  using schema::MessageType;
  switch (static_cast<MessageType>(type)) {
    case MessageType::CACHE_TASK: return render<schema::CacheTask>(p);
    case MessageType::CACHE_DEST: return render<schema::CacheDest>(p);
    case MessageType::SWAP_TASK: return render<schema::SwapTask>(p);
    case MessageType::CONNECT_TASK: return render<schema::ConnectTask>(p);
    case MessageType::CANCEL: return render<schema::Cancel>(p);
    case MessageType::REGISTER_POOL: return render<schema::RegisterPool>(p);
    case MessageType::WORKER_TASK: return render<schema::WorkerTask>(p);
    case MessageType::COMPLETION: return render<schema::Completion>(p);
    case MessageType::IPC_LANDED: return render<schema::IpcLanded>(p);
    default: return fmt::format("<{} bytes of unknown type>", payload.size());
  }
}

std::string render_signal(const records::LayerSignal& s) {
  switch (static_cast<records::SignalKind>(s.kind)) {
    case records::SignalKind::kBatch: {
      std::string out = fmt::format("batch step {}:", s.step);
      for (uint32_t i = 0; i < std::min(s.count, records::kBatchEntriesPerSignal); ++i) {
        const auto& e = s.entries[i];
        out += fmt::format(" slot {} tokens [{}, {}) tag {:08x};", e.slot, e.chunk_token_offset,
                           uint64_t{e.chunk_token_offset} + e.chunk_len, e.request_tag);
      }
      return out;
    }
    case records::SignalKind::kLayerDone:
      return fmt::format("layer_done step {} layer {}", s.step, s.layer);
    case records::SignalKind::kLegacyLayerDone:
      return fmt::format("legacy_layer_done step {} layer {}", s.step, s.layer);
    case records::SignalKind::kDeviceLayers:
      return fmt::format("device_layers step {}: {} layers, done when the GPU's word reaches {} + "
                         "layer + 1",
                         s.step, s.count, s.device_base);
  }
  return fmt::format("<unknown signal kind {}>", s.kind);
}

std::string render_report(const records::WorkerReport& r) {
  return fmt::format("handle {} rank {} kind {} bytes {} layer {} message \"{}\"", r.handle, r.rank,
                     r.kind, r.bytes_moved, r.layer, r.message_text());
}

}  // namespace

Result<std::string> peek_ring(const ControlSegment& control, const std::string& name,
                              size_t max_records) {
  static const std::regex per_rank(R"((task|landed|signal|report)[\[:](\d+)\]?)");
  std::smatch m;
  std::string out;
  if (name == "submit" || name == "completion") {
    Result<MpscRing> ring = name == "submit" ? control.submit_ring() : control.completion_ring();
    if (!ring) return ring.error();
    for (const auto& r : ring->peek(max_records))
      out += fmt::format("@{} {}: {}\n", r.position,
                         messages::message_type_name(static_cast<schema::MessageType>(r.type)),
                         render_record(r.type, r.payload));
  } else if (std::regex_match(name, m, per_rank)) {
    const auto rank = static_cast<uint32_t>(std::stoul(m[2]));
    if (rank >= control.config().tp_size)
      return make_error(Errc::kInvalidArgument,
                        fmt::format("no rank {}: instance '{}' has {} ranks", rank,
                                    control.instance(), control.config().tp_size));
    if (m[1] == "task" || m[1] == "landed") {
      Result<MpscRing> ring = m[1] == "task" ? control.task_ring(rank) : control.landed_ring(rank);
      if (!ring) return ring.error();
      for (const auto& r : ring->peek(max_records))
        out += fmt::format("@{} {}: {}\n", r.position,
                           messages::message_type_name(static_cast<schema::MessageType>(r.type)),
                           render_record(r.type, r.payload));
    } else if (m[1] == "signal") {
      auto ring = control.signal_ring<records::LayerSignal>(rank);
      if (!ring) return ring.error();
      for (const auto& s : ring->peek(max_records))
        out += render_signal(s) + "\n";
    } else {
      auto ring = control.report_ring<records::WorkerReport>(rank);
      if (!ring) return ring.error();
      for (const auto& r : ring->peek(max_records))
        out += render_report(r) + "\n";
    }
  } else {
    return make_error(
        Errc::kInvalidArgument,
        fmt::format("no ring '{}': use submit, completion, task[R], landed[R] (decode), signal[R] "
                    "or report[R]",
                    name));
  }
  if (out.empty()) out = "(no records waiting)\n";
  return out;
}

}  // namespace kvrelay::dump
