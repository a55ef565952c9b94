// libFuzzer target: the MPSC ring's consumer and observer over a ring whose
// positions, producer intents and record bytes are arbitrary, as a hostile
// or buggy process with write access could leave them. read() and peek()
// must stay inside the ring whatever they find (giving up claims whose
// producers are "dead", repairing impossible tails), and then the ring must
// go on working for a producer.
//
// Input: [head u64][tail u64][intent position u64][intent bytes u64][ring bytes ...];
// the ring has 1 KiB of records. No producer holds a lock, so every claim
// the consumer finds belongs to a dead producer.
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "shm/mpsc_ring.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kvrelay;
  constexpr uint64_t kCapacity = 1024;
  static const int lock_file = memfd_create("ring-fuzz-locks", MFD_CLOEXEC);
  if (size < 32) return 0;
  std::vector<uint64_t> region((MpscRing::bytes_for(kCapacity) + 7) / 8);
  void* mem = region.data();
  if (!MpscRing::initialize(mem, region.size() * 8, kCapacity,
                            MpscRing::default_max_payload(kCapacity))
           .ok())
    __builtin_trap();
  auto* h = static_cast<MpscRingHeader*>(mem);
  uint64_t head = 0, tail = 0, intent_at = 0, intent_bytes = 0;
  std::memcpy(&head, data, 8);
  std::memcpy(&tail, data + 8, 8);
  std::memcpy(&intent_at, data + 16, 8);
  std::memcpy(&intent_bytes, data + 24, 8);
  h->head.store(head);
  h->head_cache.store(head);
  h->tail.store(tail);
  h->producers[3].intent_position.store(intent_at);
  h->producers[3].intent_bytes.store(intent_bytes);
  auto* records = reinterpret_cast<uint8_t*>(mem) + sizeof(MpscRingHeader);
  std::memcpy(records, data + 32, std::min<size_t>(size - 32, kCapacity));

  MpscRing ring = MpscRing::attach(mem, region.size() * 8, LockSpace{lock_file, 0}).value();
  ring.set_stall_timeout(std::chrono::nanoseconds(0));  // exercise the giving-up path too
  uint64_t sum = 0;
  const auto touch = [&](const MpscRecord& r) {
    sum += static_cast<uint64_t>(r.type);
    for (std::byte b : r.payload)
      sum += static_cast<uint64_t>(b);
  };
  for (int i = 0; i < 3; ++i) {
    (void)ring.peek(16);
    ring.read(touch, 64);
    (void)ring.take_corruption();
  }
  // Whatever it found, a producer can still try to write, and nothing it
  // reads back lies outside the ring.
  if (auto producer = ring.lease_producer()) {
    std::byte payload[24] = {};
    (void)producer->try_write(1, payload);
  }
  ring.read(touch, 64);
  return sum == 0xdeadbeef ? 1 : 0;
}
