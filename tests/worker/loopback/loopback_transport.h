// A test-only transport: copies a layer's blocks into another pool of the
// same process, named by CacheDest.peerInstance. It exists to prove that a
// transport is one folder and one registry row (worker/transport_registry.h):
// this folder, and the row in loopback_transport_test.cpp, are all it takes;
// nothing in worker/ names it.
#pragma once

#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "worker/transport.h"
#include "worker/transport_registry.h"

namespace kvrelay::worker::loopback {

// Pools the transport may write into, by name (a test registers them).
void register_pool(const std::string& name, const LocalPool* pool);
void forget_pool(const std::string& name);

// The registry row's build function.
Result<BuiltTransport> build(TransportContext& c);

}  // namespace kvrelay::worker::loopback
