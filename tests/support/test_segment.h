// A control segment that a unit test creates in its own process, named after
// the running test, and that is unlinked (with every pool kvrelay made for
// it) when it goes: declare it before whatever maps its regions.
#pragma once

#include <memory>

#include "instance/control_segment.h"
#include "instance/instance_config.h"

namespace kvrelay::testing {

struct UnlinkSegment {
  void operator()(ControlSegment* control) const;
};
using TestSegment = std::unique_ptr<ControlSegment, UnlinkSegment>;

// default_config() of an instance named after the running test.
InstanceConfig test_config(uint32_t tp_size);
// Creates `config`'s instance; null, with a test failure saying why, when it cannot.
TestSegment create_test_segment(const InstanceConfig& config);

}  // namespace kvrelay::testing
