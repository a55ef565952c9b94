// libFuzzer target: the MPSC ring's consumer and observer over a ring whose
// positions and record bytes are arbitrary, as a hostile or buggy process
// with write access could leave them. read() and peek() must stay inside the
// ring whatever they find, and then the ring must go on working.
//
// Input: [head u64][tail u64][ring bytes ...]; the ring has 1 KiB of records.
#include <cstdint>
#include <cstring>
#include <vector>

#include "shm/mpsc_ring.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kvrelay;
  constexpr uint64_t kCapacity = 1024;
  if (size < 16) return 0;
  std::vector<uint64_t> region((MpscRing::bytes_for(kCapacity) + 7) / 8);
  void* mem = region.data();
  if (!MpscRing::initialize(mem, region.size() * 8, kCapacity,
                            MpscRing::default_max_payload(kCapacity))
           .ok())
    __builtin_trap();
  auto* h = static_cast<MpscRingHeader*>(mem);
  uint64_t head = 0, tail = 0;
  std::memcpy(&head, data, 8);
  std::memcpy(&tail, data + 8, 8);
  h->head.store(head);
  h->head_cache.store(head);
  h->tail.store(tail);
  auto* records = reinterpret_cast<uint8_t*>(mem) + sizeof(MpscRingHeader);
  std::memcpy(records, data + 16, std::min<size_t>(size - 16, kCapacity));

  MpscRing ring = MpscRing::attach(mem, region.size() * 8).value();
  ring.set_stall_timeout(std::chrono::nanoseconds(0));  // exercise the unblocking path too
  uint64_t sum = 0;
  const auto touch = [&](int32_t type, std::span<const std::byte> p) {
    sum += static_cast<uint64_t>(type);
    for (std::byte b : p)
      sum += static_cast<uint64_t>(b);
  };
  for (int i = 0; i < 3; ++i) {
    (void)ring.peek(16);
    ring.read(touch, 64);
  }
  // Whatever it found, a producer can still try to write, and nothing it
  // reads back lies outside the ring.
  std::byte payload[24] = {};
  (void)ring.try_write(1, payload);
  ring.read(touch, 64);
  return sum == 0xdeadbeef ? 1 : 0;
}
