#include "shm/spsc_ring.h"

#include <fmt/format.h>

#include <new>

namespace kvrelay {

Status initialize_spsc_region(void* region, size_t region_bytes, uint32_t capacity,
                              uint32_t record_bytes) {
  if (!is_pow2(capacity))
    return make_error(Errc::kInvalidArgument,
                      fmt::format("spsc ring capacity {} is not a power of two", capacity));
  if (record_bytes == 0)
    return make_error(Errc::kInvalidArgument, "spsc ring record size must be positive");
  if (region_bytes < spsc_region_bytes(capacity, record_bytes))
    return make_error(Errc::kInvalidArgument, "spsc ring region too small for its capacity");
  auto* h = new (region) SpscRingHeader{};
  h->record_bytes = record_bytes;
  h->slot_bytes = spsc_slot_bytes(record_bytes);
  h->capacity = capacity;
  std::byte* slots = static_cast<std::byte*>(region) + sizeof(SpscRingHeader);
  for (uint32_t i = 0; i < capacity; ++i) {
    new (slots + size_t{i} * h->slot_bytes) std::atomic<uint64_t>(i);  // free for record i
  }
  return {};
}

namespace spsc_detail {

Status validate(const SpscRingHeader& h, size_t region_bytes, size_t record_bytes) {
  if (h.record_bytes != record_bytes)
    return make_error(Errc::kLayoutMismatch,
                      fmt::format("spsc ring holds {}-byte records, this reader expects {}",
                                  h.record_bytes, record_bytes));
  if (h.slot_bytes != spsc_slot_bytes(h.record_bytes))
    return make_error(Errc::kCorrupt, fmt::format("spsc ring slot size {} impossible for {}-byte "
                                                  "records",
                                                  h.slot_bytes, h.record_bytes));
  if (!is_pow2(h.capacity))
    return make_error(Errc::kCorrupt,
                      fmt::format("spsc ring capacity {} is not a power of two", h.capacity));
  const size_t need = spsc_region_bytes(h.capacity, h.record_bytes);
  if (need > region_bytes)
    return make_error(Errc::kCorrupt,
                      fmt::format("spsc ring of {} x {} bytes needs {} bytes, region has {}",
                                  h.capacity, record_bytes, need, region_bytes));
  return {};
}

}  // namespace spsc_detail
}  // namespace kvrelay
