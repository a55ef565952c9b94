// open_verbs_fabric (fabric.h) on libibverbs: a VerbsDevice behind the seam.
#include <fmt/format.h>

#include "worker/rdma/fabric.h"
#include "worker/rdma/verbs_device.h"

namespace kvrelay::worker::rdma {

namespace {

class VerbsFabric final : public Fabric {
 public:
  VerbsFabric(std::unique_ptr<VerbsDevice> device, const FabricOptions& o)
      : device_(std::move(device)),
        name_(fmt::format("{} port {}", device_->name(), device_->options().port)) {
    qp_.max_send_wr = o.max_send_wr;
    qp_.max_recv_wr = o.max_recv_wr;
    qp_.timeout = o.timeout;
    qp_.retry_count = o.retry_count;
  }
  Result<std::unique_ptr<Registration>> register_memory(void* address, size_t bytes,
                                                        RemoteAccess access) override {
    Result<std::unique_ptr<MemoryRegion>> mr = device_->register_memory(address, bytes, access);
    if (!mr) return mr.error();
    return std::unique_ptr<Registration>(std::move(mr).value());
  }
  Result<std::unique_ptr<Registration>> register_dmabuf(int fd, uint64_t offset, size_t bytes,
                                                        uint64_t iova,
                                                        RemoteAccess access) override {
    Result<std::unique_ptr<MemoryRegion>> mr =
        device_->register_dmabuf(fd, offset, bytes, iova, access);
    if (!mr) return mr.error();
    return std::unique_ptr<Registration>(std::move(mr).value());
  }
  Status windows_supported() const override { return device_->windows_supported(); }
  Result<std::unique_ptr<Window>> allocate_window() override {
    Result<std::unique_ptr<MemoryWindow>> w = device_->allocate_window();
    if (!w) return w.error();
    return std::unique_ptr<Window>(std::move(w).value());
  }
  Result<std::unique_ptr<RcQueuePair>> create_queue_pair() override {
    Result<std::unique_ptr<VerbsQueuePair>> qp = device_->create_queue_pair(qp_);
    if (!qp) return qp.error();
    return std::unique_ptr<RcQueuePair>(std::move(qp).value());
  }
  const std::string& name() const override { return name_; }

 private:
  std::unique_ptr<VerbsDevice> device_;
  QueuePairOptions qp_;
  std::string name_;
};

}  // namespace

Result<std::unique_ptr<Fabric>> open_verbs_fabric(const FabricOptions& options) {
  DeviceOptions d;
  d.name = options.device;
  d.port = options.port;
  d.gid_index = options.gid_index;
  d.traffic_class = options.traffic_class;
  Result<std::unique_ptr<VerbsDevice>> device = VerbsDevice::open(d);
  if (!device) return device.error();
  return std::unique_ptr<Fabric>(std::make_unique<VerbsFabric>(std::move(device).value(), options));
}

}  // namespace kvrelay::worker::rdma
