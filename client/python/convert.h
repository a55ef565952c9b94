// Python values into the client's C++ types, with errors that name the
// argument: block ids from lists, tuples, ranges, numpy arrays or anything
// else iterable; timeouts in seconds.
#pragma once

#include <pybind11/pybind11.h>

#include <cstdint>
#include <string>
#include <vector>

#include "kvrelay/client.h"

namespace kvrelay::python {

// Integers in [0, max] from an iterable of ints (or an integer buffer such as
// a numpy array). Raises TypeError / kvrelay.InvalidArgument naming `what`.
std::vector<uint32_t> to_u32_list(pybind11::handle values, const char* what);
std::vector<uint16_t> to_port_list(pybind11::handle values, const char* what);

// A timeout in seconds as a deadline. Negative, NaN and infinite timeouts are
// refused: nothing in kvrelay waits forever.
Deadline to_deadline(double timeout_s, const char* what = "timeout");

// "ipc", "tcp" or "rdma".
Protocol to_protocol(const std::string& name);

// One batch entry: (slot, chunk_token_offset, chunk_len) or
// (slot, chunk_token_offset, chunk_len, request) with request an int tag or a
// request id string.
std::vector<BatchSlot> to_batch(pybind11::handle slots);

}  // namespace kvrelay::python
