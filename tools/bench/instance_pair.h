// A prefill instance and a decode instance started for one benchmark case,
// with a client attached to each and their rank pools mapped. Stopped (and
// their segments removed) when it goes out of scope.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "instance/control_segment.h"
#include "instance/pool_segment.h"
#include "instances.h"
#include "kvrelay/client.h"

namespace kvrelay::bench {

class InstancePair {
 public:
  // Names are unique to this process, so that benchmarks never meet a live
  // instance of someone else's.
  // `prefill_extra`: more flags for the prefill coordinator (e.g.
  // --idle-strategy spin); the decode instance, off the measured paths of an
  // ipc transfer, keeps its defaults.
  static Result<std::unique_ptr<InstancePair>> start(const sim::Geometry& g,
                                                     const std::string& tag,
                                                     const std::vector<std::string>& prefill_extra = {});
  ~InstancePair();
  InstancePair(const InstancePair&) = delete;
  InstancePair& operator=(const InstancePair&) = delete;

  Client& prefill() { return *prefill_client_; }
  // The prefill instance's control segment, read-only (its counters).
  const ControlSegment& prefill_control() const { return *prefill_control_; }
  const std::string& decode_name() const { return decode_name_; }
  PoolView& src(uint32_t rank) { return *src_[rank]; }
  PoolView& dst(uint32_t rank) { return *dst_[rank]; }
  uint32_t tp() const { return tp_; }

 private:
  InstancePair() = default;
  std::string decode_name_;
  uint32_t tp_ = 0;
  sim::ManagedInstance prefill_instance_, decode_instance_;
  std::unique_ptr<Client> prefill_client_, decode_client_;
  std::vector<std::unique_ptr<PoolView>> src_, dst_;
  std::unique_ptr<ControlSegment> prefill_control_;
};

}  // namespace kvrelay::bench
