#include "worker/ipc/registration.h"

#include "kernels/copy_engine.h"
#include "worker/ipc/ipc_transport.h"

namespace kvrelay::worker::ipc {

Result<BuiltTransport> build(TransportContext& c) {
  // ipc copies from this pool into a peer's of the same kind: memcpy between
  // host pools, the CUDA engine on the pool's GPU otherwise.
  Result<std::unique_ptr<kernels::CopyEngine>> engine = kernels::make_copy_engine(
      c.local.memory_kind(), c.local.memory_kind(),
      kernels::CudaCopyOptions{c.local.cuda_device(), c.network.copy_max_sms});
  if (!engine) return engine.error();
  BuiltTransport b;
  b.sender = std::make_unique<IpcTransport>(c.rank, c.local, std::move(engine).value(),
                                            head_layout_of(c.config), instance_of(c.config));
  return b;
}

}  // namespace kvrelay::worker::ipc
