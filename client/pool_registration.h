// What Client::register_pool sends: a PoolSpec as a PoolDescriptor, the fds
// it names in the order the descriptor's fd_index counts them, and the
// tensor-table spec of GPU tensors given by address (Client::
// register_cuda_pool).
#pragma once

#include <span>
#include <vector>

#include "kernels/device_export.h"
#include "kvrelay/client.h"
#include "schemas/kvrelay.capnp.h"

namespace kvrelay::client {

// Fills `d` from `spec` (shape: `geometry`); fd indices count the memories'
// fds and chunks in order, as fds_of() lists them.
void describe(const PoolSpec& spec, const PoolGeometry& geometry, uint64_t fd_ticket,
              schema::PoolDescriptor::Builder d);
std::vector<int> fds_of(const PoolSpec& spec);

// A PoolSpec for the exported tensors (the fds stay owned by `pool`).
PoolSpec spec_of(uint32_t rank, PoolTier tier, const kernels::ExportedPool& pool);

// Bytes of tensor i (layer-major) of a pool of `geometry`.
std::vector<uint64_t> tensor_sizes(const PoolGeometry& geometry);

}  // namespace kvrelay::client
