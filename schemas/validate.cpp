#include "schemas/validate.h"

#include <fmt/format.h>

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "instance/instance_config.h"
#include "instance/names.h"
#include "schemas/validate_text.h"

namespace kvrelay::messages::detail {

// "CacheTask 'req-17'": formatted only into an error, so that validating a
// good message allocates nothing (the coordinator's dispatch path). The id
// is shown only once it is known to be printable (validate_request_id runs
// first).
struct Who {
  std::string_view message;
  capnp::Text::Reader id;
  bool numbered = false;  // a ConnectTask: named by its task id, a number
  uint64_t number = 0;
};

}  // namespace kvrelay::messages::detail

template <>
struct fmt::formatter<kvrelay::messages::detail::Who> : fmt::formatter<std::string_view> {
  template <class FormatContext>
  auto format(const kvrelay::messages::detail::Who& w, FormatContext& ctx) const
      -> decltype(ctx.out()) {
    if (w.numbered) return fmt::format_to(ctx.out(), "{} {}", w.message, w.number);
    return fmt::format_to(ctx.out(), "{} '{}'", w.message,
                          std::string_view(w.id.cStr(), w.id.size()));
  }
};

namespace kvrelay::messages {

namespace {

using detail::entries;
using detail::invalid;
using detail::Who;
using schema::TransferProtocol;

Who who(std::string_view message, capnp::Text::Reader id) {
  return Who{message, id};
}

const char* protocol_name(TransferProtocol p) {
  switch (p) {
    case TransferProtocol::IPC: return "ipc";
    case TransferProtocol::TCP: return "tcp";
    case TransferProtocol::RDMA: return "rdma";
  }
  return "unknown";
}

bool protocol_known(TransferProtocol p) {
  return static_cast<uint16_t>(p) <= 2;
}

Status check_protocol_enabled(const Who& who, TransferProtocol p, const Limits& limits) {
  if ((limits.protocols & (1U << static_cast<uint16_t>(p))) != 0) return {};
  return invalid(fmt::format("{}: protocol {} is not enabled on this instance (see --protocol)",
                             who, protocol_name(p)));
}

// Each id below `limit`; at most `limit` ids in all; optionally no id twice.
Status check_block_list(const Who& who, std::string_view field,
                        capnp::List<uint32_t>::Reader ids, uint32_t limit, std::string_view pool,
                        bool unique) {
  if (ids.size() > limit)
    return invalid(fmt::format("{}: {} has {}; the {} has only {} blocks", who, field,
                               entries(ids.size()), pool, limit));
  for (uint32_t i = 0; i < ids.size(); ++i) {
    if (ids[i] >= limit)
      return invalid(fmt::format("{}: {}[{}] = {} is out of range: the {} has {} blocks", who,
                                 field, i, ids[i], pool, limit));
  }
  if (unique) {
    // Kept between calls: no allocation once it has held the longest list.
    thread_local std::vector<std::pair<uint32_t, uint32_t>> sorted;  // (id, position)
    sorted.clear();
    for (uint32_t i = 0; i < ids.size(); ++i)
      sorted.emplace_back(ids[i], i);
    std::sort(sorted.begin(), sorted.end());
    for (size_t i = 1; i < sorted.size(); ++i) {
      if (sorted[i].first == sorted[i - 1].first)
        return invalid(fmt::format("{}: {} has block {} twice (at {} and {})", who, field,
                                   sorted[i].first, sorted[i - 1].second, sorted[i].second));
    }
  }
  return {};
}

// One port per rank, none zero. `per_decode_rank` (tcp, rdma): one per rank
// of the decode instance, whose TP size may differ from this one's
// (heterogeneous TP: the count is that size).
Status check_ports(const Who& who, std::string_view field,
                   capnp::List<uint16_t>::Reader ports, uint32_t tp_size,
                   bool per_decode_rank = false) {
  if (per_decode_rank && (ports.size() == 0 || ports.size() > kMaxTpSize))
    return invalid(fmt::format("{}: {} has {}; it needs one port per decode rank, 1 to {}", who,
                               field, entries(ports.size()), kMaxTpSize));
  if (!per_decode_rank && ports.size() != tp_size)
    return invalid(fmt::format("{}: {} has {} but the instance has {} ranks (one port per rank)",
                               who, field, entries(ports.size()), tp_size));
  for (uint32_t r = 0; r < ports.size(); ++r) {
    if (ports[r] == 0) return invalid(fmt::format("{}: {}[{}] = 0 is not a port", who, field, r));
  }
  return {};
}

Status check_address(const Who& who, capnp::Text::Reader address, TransferProtocol p) {
  if (address.size() == 0)
    return invalid(fmt::format("{}: protocol {} needs peer_address", who, protocol_name(p)));
  if (address.size() > kMaxAddressBytes)
    return invalid(fmt::format("{}: peer_address is {} bytes; at most {} are allowed", who,
                               address.size(), kMaxAddressBytes));
  for (char c : std::string_view(address.cStr(), address.size())) {
    if (c <= ' ' || c > '~')
      return invalid(fmt::format("{}: peer_address contains a space or non-printable byte", who));
  }
  return {};
}

Status check_peer_instance(const Who& who, capnp::Text::Reader instance) {
  if (instance.size() == 0)
    return invalid(fmt::format("{}: protocol ipc needs peer_instance", who));
  if (Status s = validate_instance_name(std::string_view(instance.cStr(), instance.size())); !s)
    return invalid(fmt::format("{}: peer_instance: {}", who, s.error().message));
  return {};
}

}  // namespace

Limits Limits::from(const InstanceConfig& c) {
  Limits l;
  l.tp_size = c.tp_size;
  l.pool = pool_geometry_of(c, PoolTier::kDevice);
  l.host_blocks = c.host_blocks;
  l.protocols = c.protocols;
  l.role = c.role;
  return l;
}

Status validate_request_id(std::string_view message, capnp::Text::Reader id) {
  if (id.size() == 0) return invalid(fmt::format("{}: request_id is empty", message));
  if (id.size() > kMaxRequestIdBytes)
    return invalid(fmt::format("{}: request_id is {} bytes; at most {} are allowed", message,
                               id.size(), kMaxRequestIdBytes));
  const auto* bytes = reinterpret_cast<const unsigned char*>(id.cStr());
  for (size_t i = 0; i < id.size(); ++i) {
    if (bytes[i] <= 0x20 || bytes[i] >= 0x7f)
      return invalid(
          fmt::format("{}: request_id has byte 0x{:02x} at position {}; request ids are "
                      "printable ASCII without spaces",
                      message, bytes[i], i));
  }
  return {};
}

Status validate(schema::CacheTask::Reader task, const Limits& limits) {
  if (Status s = validate_request_id("CacheTask", task.getRequestId()); !s) return s;
  const Who w = who("CacheTask", task.getRequestId());
  const auto src = task.getSrcBlockIds();
  if (src.size() == 0) return invalid(fmt::format("{}: src_block_ids is empty", w));
  if (Status s = check_block_list(w, "src_block_ids", src, limits.pool.num_blocks, "pool", false);
      !s)
    return s;
  const uint64_t tokens = task.getNeedPrefillTokens();
  if (tokens == 0) return invalid(fmt::format("{}: need_prefill_tokens is 0", w));
  const uint64_t blocks_needed = (tokens + limits.pool.block_size - 1) / limits.pool.block_size;
  if (blocks_needed > src.size())
    return invalid(
        fmt::format("{}: need_prefill_tokens {} needs {} blocks of {} tokens but "
                    "src_block_ids has {}",
                    w, tokens, blocks_needed, limits.pool.block_size, entries(src.size())));
  if (task.isEngineSlot() && task.getEngineSlot() >= kMaxEngineSlots)
    return invalid(fmt::format("{}: engine_slot {} is out of range: slots are 0..{}", w,
                               task.getEngineSlot(), kMaxEngineSlots - 1));
  if (task.getDeadlineMs() > kMaxDeadlineMs)
    return invalid(fmt::format("{}: deadline_ms {} exceeds the limit of {} (one hour)", w,
                               task.getDeadlineMs(), kMaxDeadlineMs));
  if (task.hasSignalWatermarks() && task.getSignalWatermarks().size() != 0 &&
      task.getSignalWatermarks().size() != limits.tp_size)
    return invalid(fmt::format("{}: signal_watermarks has {} but the instance has {} ranks", w,
                               entries(task.getSignalWatermarks().size()), limits.tp_size));
  return {};
}

Status validate(schema::CacheDest::Reader dest, const Limits& limits,
                std::optional<uint32_t> peer_num_blocks) {
  if (Status s = validate_request_id("CacheDest", dest.getRequestId()); !s) return s;
  const Who w = who("CacheDest", dest.getRequestId());
  if (dest.getErrorMessage().size() > 0) return {};  // the decode side refused: nothing to check
  const TransferProtocol p = dest.getProtocol();
  if (!protocol_known(p))
    return invalid(fmt::format("{}: protocol {} is unknown (expected ipc, tcp or rdma)", w,
                               static_cast<uint16_t>(p)));
  if (Status s = check_protocol_enabled(w, p, limits); !s) return s;
  switch (p) {
    case TransferProtocol::IPC:
      if (Status s = check_peer_instance(w, dest.getPeerInstance()); !s) return s;
      if (dest.getDeviceIds().size() != limits.tp_size)
        return invalid(
            fmt::format("{}: device_ids has {} but the instance has {} ranks (one "
                        "device id per rank)",
                        w, entries(dest.getDeviceIds().size()), limits.tp_size));
      break;
    case TransferProtocol::TCP:
      if (Status s = check_address(w, dest.getPeerAddress(), p); !s) return s;
      if (Status s = check_ports(w, "tcp_ports", dest.getTcpPorts(), limits.tp_size, true); !s)
        return s;
      break;
    case TransferProtocol::RDMA:
      if (Status s = check_address(w, dest.getPeerAddress(), p); !s) return s;
      if (Status s = check_ports(w, "rdma_ports", dest.getRdmaPorts(), limits.tp_size, true); !s)
        return s;
      break;
  }
  const uint32_t dest_limit = peer_num_blocks.value_or(1U << 24);
  return check_block_list(w, "dest_block_ids", dest.getDestBlockIds(), dest_limit,
                          peer_num_blocks ? "decode pool" : "largest possible pool", true);
}

Status validate_pair(schema::CacheTask::Reader task, schema::CacheDest::Reader dest) {
  if (dest.getErrorMessage().size() > 0) return {};
  const size_t src = task.getSrcBlockIds().size();
  const size_t dst = dest.getDestBlockIds().size();
  if (dst > src)
    return invalid(fmt::format("{}: dest_block_ids has {} but src_block_ids has {}",
                               who("CacheDest", dest.getRequestId()), entries(dst), src));
  return {};
}

Status validate(schema::SwapTask::Reader swap, const Limits& limits) {
  if (Status s = validate_request_id("SwapTask", swap.getRequestId()); !s) return s;
  const Who w = who("SwapTask", swap.getRequestId());
  const auto dir = static_cast<uint16_t>(swap.getDirection());
  if (dir > 1)
    return invalid(fmt::format("{}: direction {} is unknown (expected evict or load)", w, dir));
  if (limits.host_blocks == 0)
    return invalid(fmt::format("{}: this instance has no host tier (host_blocks is 0)", w));
  const auto device = swap.getDeviceBlockIds();
  const auto host = swap.getHostBlockIds();
  if (device.size() != host.size())
    return invalid(fmt::format("{}: device_block_ids has {} but host_block_ids has {}", w,
                               entries(device.size()), host.size()));
  if (device.size() == 0) return invalid(fmt::format("{}: device_block_ids is empty", w));
  if (Status s = check_block_list(w, "device_block_ids", device, limits.pool.num_blocks,
                                  "device pool", true);
      !s)
    return s;
  if (Status s = check_block_list(w, "host_block_ids", host, limits.host_blocks, "host pool", true);
      !s)
    return s;
  const uint64_t first = swap.getFirstLayer();
  const uint64_t count =
      swap.getLayerCount() == 0 ? limits.total_layers() - first : swap.getLayerCount();
  if (first >= limits.total_layers() || first + count > limits.total_layers())
    return invalid(fmt::format("{}: layers [{}, {}) exceed the pool's {} layers", w, first,
                               first + count, limits.total_layers()));
  if (swap.getDeadlineMs() > kMaxDeadlineMs)
    return invalid(fmt::format("{}: deadline_ms {} exceeds the limit of {} (one hour)", w,
                               swap.getDeadlineMs(), kMaxDeadlineMs));
  return {};
}

Status validate(schema::ExpectArrival::Reader expect, const Limits& limits) {
  if (Status s = validate_request_id("ExpectArrival", expect.getRequestId()); !s) return s;
  const Who w = who("ExpectArrival", expect.getRequestId());
  if (limits.role != static_cast<uint32_t>(Role::kDecode))
    return invalid(
        fmt::format("{}: this is a {} instance; declare an expected request to the "
                    "decode instance its KV cache goes to",
                    w, role_name(static_cast<Role>(limits.role))));
  if (Status s = check_block_list(w, "dest_block_ids", expect.getDestBlockIds(),
                                  limits.pool.num_blocks, "pool", true);
      !s)
    return s;
  if (expect.getDeadlineMs() > kMaxDeadlineMs)
    return invalid(fmt::format("{}: deadline_ms {} exceeds the limit of {} (one hour)", w,
                               expect.getDeadlineMs(), kMaxDeadlineMs));
  if (const auto from = expect.getFromInstance(); from.size() != 0) {
    if (Status s = validate_instance_name(std::string_view(from.cStr(), from.size())); !s)
      return invalid(fmt::format("{}: from_instance: {}", w, s.error().message));
  }
  return {};
}

Status validate(schema::ConnectTask::Reader connect, const Limits& limits) {
  const Who w{"ConnectTask", {}, true, connect.getTaskId()};
  const TransferProtocol p = connect.getProtocol();
  if (!protocol_known(p))
    return invalid(fmt::format("{}: protocol {} is unknown (expected ipc, tcp or rdma)", w,
                               static_cast<uint16_t>(p)));
  if (Status s = check_protocol_enabled(w, p, limits); !s) return s;
  if (p == TransferProtocol::IPC) return check_peer_instance(w, connect.getPeerInstance());
  if (Status s = check_address(w, connect.getPeerAddress(), p); !s) return s;
  return check_ports(w, "ports", connect.getPorts(), limits.tp_size, true);
}

Status validate(schema::Cancel::Reader cancel, const Limits& /*limits*/) {
  return validate_request_id("Cancel", cancel.getRequestId());
}

Status validate_record_size(std::string_view message, std::string_view request_id, size_t bytes,
                            size_t limit, std::string_view ring_name) {
  if (bytes <= limit) return {};
  return make_error(Errc::kTooLarge,
                    fmt::format("{} '{}': encoded size {} bytes exceeds the {}'s record limit of "
                                "{} bytes",
                                message, request_id, bytes, ring_name, limit));
}

}  // namespace kvrelay::messages
