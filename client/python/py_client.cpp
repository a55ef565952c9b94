#include "py_client.h"

#include <fmt/format.h>

#include "convert.h"
#include "errors.h"

namespace py = pybind11;

namespace kvrelay::python {

PyClient::PyClient(const std::string& instance, double timeout_s) : instance_(instance) {
  const Deadline ready_by = to_deadline(timeout_s);
  Result<Client> c = [&] {
    py::gil_scoped_release release;
    return Client::attach(instance, ready_by);
  }();
  if (!c) raise(c.error());
  client_.emplace(std::move(c).value());
  info_ = client_->info();
}

void PyClient::closed() const {
  raise(Errc::kInvalidArgument,
        fmt::format("this kvrelay.Client of instance '{}' is closed", instance_));
}

const InstanceInfo& PyClient::info() {
  if (!client_) closed();
  return info_;
}

std::optional<Completion> PyClient::poll() {
  Result<std::optional<Completion>> c = with_client([&](Client& client) {
    std::lock_guard reader(completion_mutex_);
    return client.poll();
  });
  if (!c) raise(c.error());
  return std::move(c).value();
}

Completion PyClient::wait(double timeout_s) {
  const Deadline deadline = to_deadline(timeout_s);
  Result<Completion> c = with_client([&](Client& client) {
    std::lock_guard reader(completion_mutex_);
    return client.wait(deadline);
  });
  if (!c) raise(c.error());
  return std::move(c).value();
}

std::optional<Completion> PyClient::next_within(double timeout_s) {
  const Deadline deadline = to_deadline(timeout_s);
  Result<Completion> c = with_client([&](Client& client) {
    std::lock_guard reader(completion_mutex_);
    return client.wait(deadline);
  });
  if (!c) {
    if (c.code() == Errc::kTimeout) return std::nullopt;
    raise(c.error());
  }
  return std::move(c).value();
}

// Threads of one process may push concurrently (the C++ client's producer
// side is thread-safe), so no lock is taken here.
void PyClient::push_batch(uint32_t rank, uint64_t step, const std::vector<BatchSlot>& slots,
                          double timeout_s) {
  const Deadline deadline = to_deadline(timeout_s);
  check(
      with_client([&](Client& client) { return client.push_batch(rank, step, slots, deadline); }));
}

void PyClient::push_layer_done(uint32_t rank, uint64_t step, uint32_t layer, bool legacy,
                               double timeout_s) {
  const Deadline deadline = to_deadline(timeout_s);
  check(with_client([&](Client& client) {
    return legacy ? client.push_legacy_layer_done(rank, step, layer, deadline)
                  : client.push_layer_done(rank, step, layer, deadline);
  }));
}

std::unique_ptr<PoolView> PyClient::open_pool(uint32_t rank, PoolTier tier) {
  Result<PoolView> pool = with_client([&](Client& client) { return client.open_pool(rank, tier); });
  if (!pool) raise(pool.error());
  return std::make_unique<PoolView>(std::move(pool).value());
}

void PyClient::close() {
  py::gil_scoped_release release;
  std::unique_lock no_call_in_progress(life_mutex_);
  client_.reset();
}

}  // namespace kvrelay::python
