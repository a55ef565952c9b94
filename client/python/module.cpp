// The Python module `kvrelay` (see kvrelay.pyi for the documented API).
#include <fmt/format.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "convert.h"
#include "docstrings.h"
#include "errors.h"
#include "py_client.h"
#include "py_pool.h"

namespace py = pybind11;
using namespace py::literals;

namespace kvrelay::python {

namespace {

const char* kind_name(CompletionKind k) {
  switch (k) {
    case CompletionKind::kCache: return "cache";
    case CompletionKind::kSwap: return "swap";
    case CompletionKind::kConnect: return "connect";
    case CompletionKind::kRegisterPool: return "register_pool";
    case CompletionKind::kOther: return "other";
    case CompletionKind::kCancel: return "cancel";
    case CompletionKind::kArrived: return "arrived";
  }
  return "other";
}

void define_completion(py::module_& m) {
  py::class_<Completion>(m, "Completion",
                         "The one completion of a request (or of a rejected submission).")
      .def_readonly("request_id", &Completion::request_id)
      .def_property_readonly(
          "kind", [](const Completion& c) { return kind_name(c.kind); },
          "'cache', 'swap', 'connect', 'register_pool', 'cancel', 'arrived' or 'other'")
      .def_property_readonly(
          "status", [](const Completion& c) { return completion_status_name(c.status); },
          "'finished', 'error', 'cancelled', 'timeout' or 'rejected'")
      .def_property_readonly(
          "ok", [](const Completion& c) { return c.status == CompletionStatus::kFinished; })
      .def_property_readonly(
          "error_rank",
          [](const Completion& c) -> py::object {
            if (c.error_rank < 0) return py::none();
            return py::int_(c.error_rank);
          },
          "the rank that failed the request, or None")
      .def_readonly("message", &Completion::message)
      .def_readonly("bytes_moved", &Completion::bytes_moved)
      .def_readonly("submitted_ns", &Completion::submitted_ns, "CLOCK_MONOTONIC")
      .def_readonly("completed_ns", &Completion::completed_ns, "CLOCK_MONOTONIC")
      .def_readonly("first_copy_ns", &Completion::first_copy_ns,
                    "CLOCK_MONOTONIC when the first rank began copying; 0: nothing copied")
      .def_readonly("blocks_reusable", &Completion::blocks_reusable,
                    "True when no rank can still write into the destination blocks")
      .def_property_readonly("latency_s",
                             [](const Completion& c) {
                               return c.completed_ns >= c.submitted_ns
                                          ? static_cast<double>(c.completed_ns - c.submitted_ns) /
                                                1e9
                                          : 0.0;
                             })
      .def("__repr__", [](const Completion& c) {
        const auto quoted = [](const std::string& text) {
          return py::repr(py::str(text)).cast<std::string>();
        };
        std::string s =
            fmt::format("Completion(request_id={}, kind='{}', status='{}'", quoted(c.request_id),
                        kind_name(c.kind), completion_status_name(c.status));
        if (c.error_rank >= 0) s += fmt::format(", error_rank={}", c.error_rank);
        if (!c.message.empty()) s += fmt::format(", message={}", quoted(c.message));
        return s + fmt::format(", bytes_moved={})", c.bytes_moved);
      });
}

// Iterates completions until none arrives within `timeout_s` of the previous.
class CompletionIterator {
 public:
  CompletionIterator(py::object client, double timeout_s)
      : client_(std::move(client)), timeout_s_(timeout_s) {
    to_deadline(timeout_s_);  // validates now, not at the first next()
  }
  Completion next() {
    std::optional<Completion> c = client_.cast<PyClient&>().next_within(timeout_s_);
    if (!c) throw py::stop_iteration();
    return std::move(*c);
  }

 private:
  py::object client_;
  double timeout_s_;
};

py::dict config_dict(const InstanceInfo& c) {
  const PoolGeometry& g = c.device_pool;
  return py::dict("instance"_a = c.instance, "role"_a = role_name(c.role), "tp_size"_a = c.tp_size,
                  "num_layers"_a = g.num_layers, "extra_layers"_a = g.extra_layers,
                  "num_blocks"_a = g.num_blocks, "extra_layer_blocks"_a = g.extra_layer_blocks,
                  "host_blocks"_a = c.host_pool.num_blocks, "block_size"_a = g.block_size,
                  "kv_heads"_a = g.kv_heads, "total_kv_heads"_a = c.total_kv_heads,
                  "head_dim"_a = g.head_dim,
                  "dtype"_a = dtype_name(static_cast<CacheDtype>(g.dtype)),
                  "has_scales"_a = g.has_scales != 0, "k_only"_a = g.k_only != 0,
                  "request_deadline_ms"_a = c.request_deadline_ms);
}

void define_client(py::module_& m) {
  py::class_<CompletionIterator>(m, "_CompletionIterator")
      .def("__iter__", [](py::object self) { return self; })
      .def("__next__", &CompletionIterator::next);

  py::class_<PyClient>(m, "Client", "The engine-side client of one kvrelay instance.")
      .def(py::init<const std::string&, double>(), py::arg("instance"), py::arg("timeout") = 30.0,
           "Attaches to `instance`, waiting up to `timeout` seconds for it to be ready.")
      .def_property_readonly("instance", [](PyClient& c) { return c.info().instance; })
      .def_property_readonly("tp_size", [](PyClient& c) { return c.info().tp_size; })
      .def_property_readonly("num_layers",
                             [](PyClient& c) { return c.info().device_pool.num_layers; })
      .def_property_readonly("config", [](PyClient& c) { return config_dict(c.info()); })
      .def_property_readonly("closed", &PyClient::closed_now)
      .def_property_readonly(
          "epoch", [](PyClient& c) { return c.with_client([](Client& cl) { return cl.epoch(); }); })
      .def(
          "rank_ready",
          [](PyClient& c, uint32_t rank) {
            return c.with_client([&](Client& cl) { return cl.rank_ready(rank); });
          },
          py::arg("rank"))
      .def("coordinator_alive",
           [](PyClient& c) {
             return c.with_client([](Client& cl) { return cl.coordinator_alive().ok(); });
           })
      .def_property_readonly(
          "session",
          [](PyClient& c) { return c.with_client([](Client& cl) { return cl.session(); }); })
      .def_property_readonly(
          "dropped_completions",
          [](PyClient& c) {
            return c.with_client([](Client& cl) { return cl.dropped_completions(); });
          })
      .def(
          "own_signals",
          [](PyClient& c, uint32_t rank) {
            check(c.with_client([&](Client& cl) { return cl.own_signals(rank); }));
          },
          py::arg("rank"))
      .def_static(
          "request_tag", [](const std::string& id) { return Client::request_tag(id); },
          py::arg("request_id"))
      .def_static("random_nonce", [] { return Client::random_nonce(); })

      // ---- submissions ----
      .def(
          "submit_cache_task",
          [](PyClient& c, const std::string& request_id, py::handle src_block_ids,
             uint64_t need_prefill_tokens, std::optional<uint32_t> engine_slot,
             std::optional<uint64_t> legacy_prefill_step, uint32_t deadline_ms, double timeout) {
            CacheTaskSpec t;
            t.request_id = request_id;
            t.src_block_ids = to_u32_list(src_block_ids, "src_block_ids");
            t.need_prefill_tokens = need_prefill_tokens;
            t.engine_slot = engine_slot;
            t.legacy_prefill_step = legacy_prefill_step;
            t.deadline_ms = deadline_ms;
            const Deadline d = to_deadline(timeout);
            check(c.with_client([&](Client& cl) { return cl.submit(t, d); }));
          },
          py::arg("request_id"), py::arg("src_block_ids"), py::arg("need_prefill_tokens"),
          py::kw_only(), py::arg("engine_slot") = py::none(),
          py::arg("legacy_prefill_step") = py::none(), py::arg("deadline_ms") = 0,
          py::arg("timeout") = 5.0)
      .def(
          "submit_cache_dest",
          [](PyClient& c, const std::string& request_id, py::handle dest_block_ids,
             const std::string& protocol, const std::string& peer_instance,
             const std::string& peer_address, py::handle rdma_ports, py::handle tcp_ports,
             py::handle device_ids, const std::string& error_message, uint64_t request_nonce,
             double timeout) {
            CacheDestSpec d;
            d.request_id = request_id;
            d.dest_block_ids = to_u32_list(dest_block_ids, "dest_block_ids");
            d.protocol = to_protocol(protocol);
            d.peer_instance = peer_instance;
            d.peer_address = peer_address;
            d.rdma_ports = to_port_list(rdma_ports, "rdma_ports");
            d.tcp_ports = to_port_list(tcp_ports, "tcp_ports");
            d.device_ids = to_u32_list(device_ids, "device_ids");
            d.error_message = error_message;
            d.request_nonce = request_nonce;
            const Deadline until = to_deadline(timeout);
            check(c.with_client([&](Client& cl) { return cl.submit(d, until); }));
          },
          py::arg("request_id"), py::arg("dest_block_ids"), py::kw_only(),
          py::arg("protocol") = "ipc", py::arg("peer_instance") = "", py::arg("peer_address") = "",
          py::arg("rdma_ports") = py::none(), py::arg("tcp_ports") = py::none(),
          py::arg("device_ids") = py::none(), py::arg("error_message") = "",
          py::arg("request_nonce") = 0, py::arg("timeout") = 5.0)
      .def(
          "submit_swap",
          [](PyClient& c, const std::string& request_id, const std::string& direction,
             py::handle device_block_ids, py::handle host_block_ids, uint32_t first_layer,
             uint32_t layer_count, uint32_t deadline_ms, double timeout) {
            SwapSpec s;
            s.request_id = request_id;
            if (direction != "evict" && direction != "load")
              raise(Errc::kInvalidArgument,
                    fmt::format("direction '{}' is not 'evict' or 'load'", direction));
            s.load = direction == "load";
            s.device_block_ids = to_u32_list(device_block_ids, "device_block_ids");
            s.host_block_ids = to_u32_list(host_block_ids, "host_block_ids");
            s.first_layer = first_layer;
            s.layer_count = layer_count;
            s.deadline_ms = deadline_ms;
            const Deadline d = to_deadline(timeout);
            check(c.with_client([&](Client& cl) { return cl.submit(s, d); }));
          },
          py::arg("request_id"), py::arg("direction"), py::arg("device_block_ids"),
          py::arg("host_block_ids"), py::kw_only(), py::arg("first_layer") = 0,
          py::arg("layer_count") = 0, py::arg("deadline_ms") = 0, py::arg("timeout") = 5.0)
      .def(
          "expect_arrival",
          [](PyClient& c, const std::string& request_id, py::handle dest_block_ids,
             uint32_t deadline_ms, const std::string& from_instance, uint64_t request_nonce,
             double timeout) {
            ExpectSpec e;
            e.request_id = request_id;
            e.dest_block_ids = to_u32_list(dest_block_ids, "dest_block_ids");
            e.deadline_ms = deadline_ms;
            e.from_instance = from_instance;
            e.request_nonce = request_nonce;
            const Deadline d = to_deadline(timeout);
            check(c.with_client([&](Client& cl) { return cl.submit(e, d); }));
          },
          py::arg("request_id"), py::arg("dest_block_ids"), py::kw_only(),
          py::arg("deadline_ms") = 0, py::arg("from_instance") = "", py::arg("request_nonce") = 0,
          py::arg("timeout") = 5.0)
      .def(
          "connect",
          [](PyClient& c, uint64_t task_id, const std::string& protocol,
             const std::string& peer_instance, const std::string& peer_address, py::handle ports,
             double timeout) {
            ConnectSpec s;
            s.task_id = task_id;
            s.protocol = to_protocol(protocol);
            s.peer_instance = peer_instance;
            s.peer_address = peer_address;
            s.ports = to_port_list(ports, "ports");
            const Deadline d = to_deadline(timeout);
            check(c.with_client([&](Client& cl) { return cl.submit(s, d); }));
          },
          py::arg("task_id"), py::kw_only(), py::arg("protocol") = "ipc",
          py::arg("peer_instance") = "", py::arg("peer_address") = "",
          py::arg("ports") = py::none(), py::arg("timeout") = 5.0)
      .def(
          "cancel",
          [](PyClient& c, const std::string& request_id, double timeout) {
            const Deadline d = to_deadline(timeout);
            check(c.with_client([&](Client& cl) { return cl.cancel(request_id, d); }));
          },
          py::arg("request_id"), py::kw_only(), py::arg("timeout") = 5.0)
      .def(
          "register_pool",
          [](PyClient& c, uint32_t rank, const std::string& segment_name, bool host_tier,
             double timeout) {
            const Deadline d = to_deadline(timeout);
            PoolSpec spec;
            spec.rank = rank;
            spec.tier = host_tier ? PoolTier::kHost : PoolTier::kDevice;
            spec.segment_name = segment_name;
            check(c.with_client([&](Client& cl) { return cl.register_pool(spec, d); }));
          },
          py::arg("rank"), py::arg("segment_name"), py::kw_only(), py::arg("host_tier") = false,
          py::arg("timeout") = 5.0)
      .def(
          "register_host_fd_pool",
          [](PyClient& c, uint32_t rank, const std::vector<std::pair<int, uint64_t>>& memories,
             const std::vector<std::pair<uint32_t, uint64_t>>& tensors, bool host_tier,
             double timeout) {
            const Deadline d = to_deadline(timeout);
            PoolSpec spec;
            spec.rank = rank;
            spec.tier = host_tier ? PoolTier::kHost : PoolTier::kDevice;
            spec.location = PoolLocation::kHostFd;
            for (const auto& [fd, bytes] : memories) {
              PoolMemorySpec memory;
              memory.fd = fd;
              memory.bytes = bytes;
              spec.memories.push_back(memory);
            }
            for (const auto& [memory, offset] : tensors)
              spec.tensors.push_back(TensorPlacement{memory, offset});
            check(c.with_client([&](Client& cl) { return cl.register_pool(spec, d); }));
          },
          py::arg("rank"), py::arg("memories"), py::arg("tensors"), py::kw_only(),
          py::arg("host_tier") = false, py::arg("timeout") = 5.0)
      .def(
          "register_cuda_pool",
          [](PyClient& c, uint32_t rank, const std::vector<uint64_t>& tensors, bool host_tier,
             double timeout) {
            const Deadline d = to_deadline(timeout);
            check(c.with_client([&](Client& cl) {
              return cl.register_cuda_pool(rank, host_tier ? PoolTier::kHost : PoolTier::kDevice,
                                           tensors, d);
            }));
          },
          py::arg("rank"), py::arg("tensors"), py::kw_only(), py::arg("host_tier") = false,
          py::arg("timeout") = 5.0)

      // ---- layer signals ----
      .def(
          "push_batch",
          [](PyClient& c, uint32_t rank, uint64_t step, py::handle slots, double timeout) {
            c.push_batch(rank, step, to_batch(slots), timeout);
          },
          py::arg("rank"), py::arg("step"), py::arg("slots"), py::kw_only(),
          py::arg("timeout") = 5.0)
      .def(
          "push_layer_done",
          [](PyClient& c, uint32_t rank, uint64_t step, uint32_t layer, double timeout) {
            c.push_layer_done(rank, step, layer, false, timeout);
          },
          py::arg("rank"), py::arg("step"), py::arg("layer"), py::kw_only(),
          py::arg("timeout") = 5.0)
      .def(
          "push_legacy_layer_done",
          [](PyClient& c, uint32_t rank, uint64_t step, uint32_t layer, double timeout) {
            c.push_layer_done(rank, step, layer, true, timeout);
          },
          py::arg("rank"), py::arg("step"), py::arg("layer"), py::kw_only(),
          py::arg("timeout") = 5.0)

      // ---- GPU-written layer signals (streams are cudaStream_t as ints) ----
      .def(
          "own_device_signals",
          [](PyClient& c, uint32_t rank) {
            check(c.with_client([&](Client& cl) { return cl.own_device_signals(rank); }));
          },
          py::arg("rank"))
      .def(
          "push_device_step",
          [](PyClient& c, uint32_t rank, uint64_t step, py::handle slots, uint32_t layers,
             uintptr_t stream, double timeout) {
            const std::vector<BatchSlot> batch = to_batch(slots);
            const Deadline d = to_deadline(timeout);
            check(c.with_client([&](Client& cl) {
              return cl.push_device_step(rank, step, batch, layers,
                                         reinterpret_cast<void*>(stream), d);
            }));
          },
          py::arg("rank"), py::arg("step"), py::arg("slots"), py::arg("layers"), py::arg("stream"),
          py::kw_only(), py::arg("timeout") = 5.0)
      .def(
          "signal_layer",
          [](PyClient& c, uint32_t rank, uint32_t layer, uintptr_t stream) {
            check(c.with_client([&](Client& cl) {
              return cl.signal_layer(rank, layer, reinterpret_cast<void*>(stream));
            }));
          },
          py::arg("rank"), py::arg("layer"), py::arg("stream"))

      // ---- swap loads ----
      .def(
          "wait_layer",
          [](PyClient& c, const std::string& request_id, uint32_t layer,
             std::optional<uint32_t> rank, double timeout) {
            const Deadline d = to_deadline(timeout);
            check(c.with_client(
                [&](Client& cl) { return cl.wait_layer(request_id, layer, d, rank); }));
          },
          py::arg("request_id"), py::arg("layer"), py::kw_only(), py::arg("rank") = py::none(),
          py::arg("timeout") = 30.0)
      .def(
          "stream_wait_layer",
          [](PyClient& c, const std::string& request_id, uint32_t layer, uintptr_t stream,
             std::optional<uint32_t> rank, double timeout) {
            const Deadline d = to_deadline(timeout);
            check(c.with_client([&](Client& cl) {
              return cl.stream_wait_layer(request_id, layer, reinterpret_cast<void*>(stream), d,
                                          rank);
            }));
          },
          py::arg("request_id"), py::arg("layer"), py::arg("stream"), py::kw_only(),
          py::arg("rank") = py::none(), py::arg("timeout") = 30.0)

      // ---- completions ----
      .def("own_completions",
           [](PyClient& c) {
             check(c.with_client([](Client& cl) { return cl.own_completions(); }));
           })
      .def("poll", &PyClient::poll)
      .def("wait", &PyClient::wait, py::arg("timeout"))
      .def(
          "completions",
          [](py::object self, double timeout) { return CompletionIterator(self, timeout); },
          py::arg("timeout") = 0.0)

      // ---- pools ----
      .def(
          "open_pool",
          [](PyClient& c, uint32_t rank, bool host_tier) {
            return PyPool(c.open_pool(rank, host_tier ? PoolTier::kHost : PoolTier::kDevice));
          },
          py::arg("rank"), py::kw_only(), py::arg("host_tier") = false)

      .def("close", &PyClient::close)
      .def("__enter__", [](py::object self) { return self; })
      .def("__exit__", [](PyClient& c, py::handle, py::handle, py::handle) { c.close(); })
      .def("__repr__", [](PyClient& c) {
        if (c.closed_now()) return std::string("<kvrelay.Client (closed)>");
        const InstanceInfo& info = c.info();
        return fmt::format("<kvrelay.Client instance='{}' role={} tp_size={}>", info.instance,
                           role_name(info.role), info.tp_size);
      });
}

}  // namespace

}  // namespace kvrelay::python

PYBIND11_MODULE(kvrelay, m) {
  m.attr("__version__") = KVRELAY_VERSION;
  kvrelay::python::define_errors(m);
  kvrelay::python::define_completion(m);
  kvrelay::python::define_pool(m);
  kvrelay::python::define_client(m);
  kvrelay::python::attach_docstrings(m);  // the module's, too: from kvrelay.pyi
}
