// What each counter and histogram of an instance means, for the HELP lines
// of kvrelay-dump --prometheus: the texts live beside the labels they
// describe (worker/worker_counters.h, coordinator/coordinator_counters.h,
// instance/control_layout.h); this finds one by its block and label.
#pragma once

#include <string>
#include <string_view>

namespace kvrelay::dump {

// `block` is "coordinator", "clients" or "worker". A label no table knows
// (a newer writer's) gets a text that says only what it is.
std::string metric_help(std::string_view block, std::string_view label, bool histogram);

}  // namespace kvrelay::dump
