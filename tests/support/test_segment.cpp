#include "support/test_segment.h"

#include <gtest/gtest.h>

#include "instance/pool_segment.h"
#include "support/processes.h"

namespace kvrelay::testing {

void UnlinkSegment::operator()(ControlSegment* control) const {
  unlink_kvrelay_pools(*control);
  (void)control->unlink();
  delete control;
}

InstanceConfig test_config(uint32_t tp_size) {
  return default_config(current_test_instance(), tp_size);
}

TestSegment create_test_segment(const InstanceConfig& config) {
  Result<ControlSegment> c = ControlSegment::create(config);
  if (!c) {
    ADD_FAILURE() << "cannot create the test's instance: " << c.error().message;
    return nullptr;
  }
  return TestSegment(new ControlSegment(std::move(c).value()));
}

}  // namespace kvrelay::testing
