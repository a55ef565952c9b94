// `kvrelay-dump --ring NAME --peek N`: the records waiting in a ring,
// decoded (Cap'n Proto rendered as text, fixed records field by field),
// read without consuming them.
#pragma once

#include <string>

#include "instance/control_segment.h"

namespace kvrelay::dump {

// NAME: submit, completion, task[R], signal[R], report[R] (or task:R ...).
Result<std::string> peek_ring(const ControlSegment& control, const std::string& name,
                              size_t max_records);

}  // namespace kvrelay::dump
