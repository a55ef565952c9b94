// kvrelay.Client: the C++ client behind a Python object that is safe to share
// between Python threads. The GIL is released whenever a call may wait; in
// exchange the wrapper serialises what the C++ contract requires to be single
// (the completion reader) and keeps the client alive while any call is using
// it. Signal pushes need no lock: the C++ client takes them from any thread.
#pragma once

#include <pybind11/pybind11.h>

#include <memory>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <string>
#include <vector>

#include "kvrelay/client.h"

namespace kvrelay::python {

class PyPool;

class PyClient {
 public:
  PyClient(const std::string& instance, double timeout_s);

  // Runs `call` on the client with the GIL released; raises
  // kvrelay.Error if the client was closed.
  template <class Call>
  auto with_client(Call&& call) {
    std::shared_lock life(life_mutex_, std::defer_lock);
    {
      pybind11::gil_scoped_release release;
      life.lock();
    }
    if (!client_) closed();
    pybind11::gil_scoped_release release;
    return call(*client_);
  }

  // Completions: one reader at a time.
  std::optional<Completion> poll();
  Completion wait(double timeout_s);
  // `timeout_s` may be 0: the next waiting completion or none.
  std::optional<Completion> next_within(double timeout_s);

  // Signals: any thread.
  void push_batch(uint32_t rank, uint64_t step, const std::vector<BatchSlot>& slots,
                  double timeout_s);
  void push_layer_done(uint32_t rank, uint64_t step, uint32_t layer, bool legacy, double timeout_s);

  // Detaches; later calls raise. Waits for calls in progress to return.
  void close();
  bool closed_now() const { return !client_; }

  const InstanceInfo& info();
  std::unique_ptr<PoolView> open_pool(uint32_t rank, PoolTier tier);

 private:
  [[noreturn]] void closed() const;

  std::string instance_;
  std::optional<Client> client_;
  InstanceInfo info_;
  std::shared_mutex life_mutex_;  // shared: a call in progress; exclusive: close()
  std::mutex completion_mutex_;
};

}  // namespace kvrelay::python
