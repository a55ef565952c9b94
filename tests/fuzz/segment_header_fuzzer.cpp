// libFuzzer target: a same-uid process scribbles on a live instance's control
// segment header and region directory. Nobody may crash:
//  - the instance's owner (a created ControlSegment, what the coordinator
//    holds) keeps using its validated copies: regions, rings, the pool
//    directory, liveness and counters;
//  - a fresh attach (a worker, a client) refuses what it cannot trust, or
//    attaches and works through its own copy;
//  - kvrelay-dump's views (snapshot, render) of both.
// The segment is created once and its pristine header restored before each
// input, so every input starts from a live instance.
//
// Input: pairs of [offset u16][xor byte], applied to the first
// sizeof(SegmentHeader) bytes.
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "instance/control_segment.h"
#include "instance/names.h"
#include "instance/pool_segment.h"
#include "instance_view.h"
#include "render.h"
#include "schemas/records.h"

namespace {

using namespace kvrelay;

struct Live {
  std::string name = "fuzz-header-" + std::to_string(getpid());
  std::unique_ptr<ControlSegment> owner;
  std::vector<std::byte> pristine;

  Live() {
    InstanceConfig c = default_config(name, 2);
    c.submit_ring_bytes = c.completion_ring_bytes = c.task_ring_bytes = 1 << 16;
    c.signal_ring_records = c.report_ring_records = 64;
    auto seg = ControlSegment::create(c);
    if (!seg) __builtin_trap();
    owner = std::make_unique<ControlSegment>(std::move(seg).value());
    owner->set_state(InstanceState::kReady);
    const auto* base = owner->segment().data();
    pristine.assign(base, base + sizeof(SegmentHeader));
  }
  ~Live() { (void)owner->unlink(); }
};

void use(const ControlSegment& c) {
  uint64_t sum = 0;
  for (uint32_t kind = 1; kind <= 11; ++kind)
    sum += c.region(static_cast<RegionKind>(kind)).size();
  if (auto ring = c.submit_ring()) sum += ring->read([](const MpscRecord&) {});
  for (uint32_t r = 0; r < c.config().tp_size; ++r) {
    if (auto ring = c.task_ring(r)) sum += ring->used_bytes();
    if (auto ring = c.signal_ring<records::LayerSignal>(r)) sum += ring->size();
    sum += read_slot(c.worker_slot(r)).registrations;
    (void)find_pool(c, r, PoolTier::kDevice);
  }
  const dump::InstanceView v = dump::snapshot(c);
  sum += dump::render_text(v, nullptr).size();
  sum += dump::render_json(v).dump().size();
  if (sum == 0xdeadbeefULL) __builtin_trap();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static Live live;
  std::byte* header = live.owner->segment().data();
  std::memcpy(header, live.pristine.data(), live.pristine.size());
  for (size_t i = 0; i + 3 <= size; i += 3) {
    uint16_t offset = 0;
    std::memcpy(&offset, data + i, 2);
    header[offset % sizeof(SegmentHeader)] ^= std::byte(data[i + 2]);
  }
  use(*live.owner);
  if (auto attached = ControlSegment::attach(live.name)) use(*attached);
  return 0;
}
