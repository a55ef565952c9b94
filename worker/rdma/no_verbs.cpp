// open_verbs_fabric (fabric.h) in a build without rdma-core's headers.
#include "worker/rdma/fabric.h"

namespace kvrelay::worker::rdma {

Result<std::unique_ptr<Fabric>> open_verbs_fabric(const FabricOptions&) {
  return make_error(Errc::kInvalidArgument,
                    "this build has no rdma support: libibverbs-dev was missing when it was "
                    "configured (tools/setup.sh installs it)");
}

}  // namespace kvrelay::worker::rdma
