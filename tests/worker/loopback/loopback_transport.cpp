#include "worker/loopback/loopback_transport.h"

#include <fmt/format.h>

#include <cstring>

namespace kvrelay::worker::loopback {

namespace {

std::mutex pools_mu;
std::map<std::string, const LocalPool*>& pools() {
  static std::map<std::string, const LocalPool*> p;
  return p;
}

class LoopbackTransport;

class LoopbackDestination final : public Destination {
 public:
  LoopbackDestination(const LocalPool& from, const LocalPool& to, std::string peer,
                      std::vector<TransferCompletion>& done)
      : from_(from), to_(to), peer_(std::move(peer)), done_(done) {}
  uint32_t blocks_in_layer(uint32_t layer) const override {
    return to_.geometry().blocks_in_layer(layer);
  }
  const std::string& peer() const override { return peer_; }
  Status submit_layer(const TransferTicket& ticket, uint32_t layer,
                      std::span<const BlockRun> runs) override {
    uint64_t bytes = 0;
    const PoolGeometry& g = from_.geometry();
    for (uint32_t t = 0; t < g.tensors_per_layer(); ++t) {
      const auto tensor = static_cast<PoolTensor>(t);
      const uint64_t block = g.block_bytes(tensor);
      for (const BlockRun& r : runs) {
        std::memcpy(to_.tensor(layer, tensor) + r.dst_block * block,
                    from_.tensor(layer, tensor) + r.src_block * block, r.count * block);
        bytes += r.count * block;
      }
    }
    done_.push_back(TransferCompletion{ticket, bytes, {}});
    return {};
  }

 private:
  const LocalPool& from_;
  const LocalPool& to_;
  std::string peer_;
  std::vector<TransferCompletion>& done_;
};

class LoopbackTransport final : public Transport {
 public:
  explicit LoopbackTransport(const LocalPool& local) : local_(local) {}
  const char* name() const override { return "loopback"; }
  Result<std::shared_ptr<Destination>> resolve(schema::CacheDest::Reader dest) override {
    const std::string peer = dest.getPeerInstance().cStr();
    std::lock_guard lock(pools_mu);
    auto it = pools().find(peer);
    if (it == pools().end())
      return make_error(Errc::kNotFound, fmt::format("no loopback pool '{}'", peer));
    return std::shared_ptr<Destination>(std::make_shared<LoopbackDestination>(
        local_, *it->second, fmt::format("loopback pool '{}'", peer), done_));
  }
  Status check_connect(schema::ConnectTask::Reader) override { return {}; }
  void poll(std::vector<TransferCompletion>& out) override {
    out.insert(out.end(), done_.begin(), done_.end());
    done_.clear();
  }
  bool has_completions() const override { return !done_.empty(); }

 private:
  const LocalPool& local_;
  std::vector<TransferCompletion> done_;
};

}  // namespace

void register_pool(const std::string& name, const LocalPool* pool) {
  std::lock_guard lock(pools_mu);
  pools()[name] = pool;
}

void forget_pool(const std::string& name) {
  std::lock_guard lock(pools_mu);
  pools().erase(name);
}

Result<BuiltTransport> build(TransportContext& c) {
  BuiltTransport b;
  b.sender = std::make_unique<LoopbackTransport>(c.local);
  return b;
}

}  // namespace kvrelay::worker::loopback
