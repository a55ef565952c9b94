#include "worker/net/peer_link.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <future>

namespace kvrelay::worker::net {

namespace {
constexpr auto kMinBackoff = std::chrono::milliseconds(100);
constexpr auto kMaxBackoff = std::chrono::milliseconds(5000);
}  // namespace

uint32_t PeerLink::blocks_in_layer(uint32_t layer) const {
  if (!known_.load(std::memory_order_acquire)) return UINT32_MAX;
  return layer < layers_.load(std::memory_order_relaxed)
             ? blocks_.load(std::memory_order_relaxed)
             : extra_blocks_.load(std::memory_order_relaxed);
}

std::optional<std::string> PeerLink::backing_off() const {
  const auto now = Clock::now();
  if (now >= retry_at_) return std::nullopt;
  return fmt::format(
      "cannot reach it: {} (next attempt in {} ms)", last_error_,
      std::chrono::duration_cast<std::chrono::milliseconds>(retry_at_ - now).count());
}

void PeerLink::connected(const HelloAck& ack) {
  if (epoch_ != 0 && epoch_ != ack.epoch)
    spdlog::info("rank {}: {} restarted (a new pool there)", rank_, name_);
  epoch_ = ack.epoch;
  layers_.store(ack.pool.num_layers, std::memory_order_relaxed);
  blocks_.store(ack.pool.num_blocks, std::memory_order_relaxed);
  extra_blocks_.store(ack.pool.extra_layer_blocks, std::memory_order_relaxed);
  known_.store(true, std::memory_order_release);
  stats_->opened.fetch_add(1, std::memory_order_relaxed);
  backoff_ = std::chrono::milliseconds(0);
  retry_at_ = {};
  for (auto& w : std::exchange(waiters_, {}))
    w({});
}

void PeerLink::unreachable(const std::string& why) {
  stats_->unreachable.fetch_add(1, std::memory_order_relaxed);
  last_error_ = why;
  backoff_ = std::clamp(backoff_ * 2, std::chrono::milliseconds(kMinBackoff),
                        std::chrono::milliseconds(kMaxBackoff));
  retry_at_ = Clock::now() + backoff_;
  spdlog::warn("rank {}: cannot reach {}: {} (retrying after {} ms)", rank_, name_, why,
               backoff_.count());
  for (auto& w : std::exchange(waiters_, {}))
    w(make_error(Errc::kTimeout, fmt::format("cannot reach {}: {}", name_, why)));
}

void PeerLink::lost(const std::string& why) const {
  stats_->lost.fetch_add(1, std::memory_order_relaxed);
  spdlog::warn("rank {}: {} to {} closed: {}", rank_, connection_, name_, why);
}

void PeerLink::stop() {
  for (auto& w : std::exchange(waiters_, {}))
    w(make_error(Errc::kAborted, "the worker's transport is stopping"));
}

Status await_connected(boost::asio::any_io_executor strand,
                       std::function<void(std::function<void(Status)>)> ensure,
                       const std::string& name, std::chrono::milliseconds timeout) {
  auto result = std::make_shared<std::promise<Status>>();
  std::future<Status> answer = result->get_future();
  boost::asio::post(strand, [ensure = std::move(ensure), result] {
    ensure([result](Status s) { result->set_value(std::move(s)); });
  });
  if (answer.wait_for(timeout + std::chrono::milliseconds(500)) != std::future_status::ready)
    return make_error(Errc::kTimeout,
                      fmt::format("no answer from {} within {} ms", name, timeout.count()));
  return answer.get();
}

}  // namespace kvrelay::worker::net
