// Whether a TCP peer accepts connections: what a connect task can check for
// the network protocols before their transports are in place.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

#include "shm/result.h"

namespace kvrelay::worker {

Status tcp_probe(const std::string& host, uint16_t port, std::chrono::milliseconds timeout);

}  // namespace kvrelay::worker
