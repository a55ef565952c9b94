#include "py_pool.h"

#include <fmt/format.h>

#include "errors.h"

namespace py = pybind11;

namespace kvrelay::python {

namespace {

// The object behind a block's memoryview: it owns a reference to the mapping,
// so a view outlives neither the pool nor the block's memory.
struct BlockBuffer {
  std::shared_ptr<PoolView> pool;
  std::byte* data;
  uint64_t bytes;
};

const char* kTensorNames[] = {"k", "v", "k_scale", "v_scale"};

}  // namespace

// A tensor by its name ('k', 'v', 'k_scale', 'v_scale') or its id (0..3),
// one this pool has: a K-only (MLA) pool has no 'v'.
PoolTensor PyPool::to_tensor(py::handle tensor) const {
  const PoolGeometry& g = geometry();
  std::string present;
  for (uint32_t slot = 0; slot < g.tensors_per_layer(); ++slot)
    present += fmt::format("{}'{}'", slot == 0 ? "" : ", ",
                           kTensorNames[static_cast<uint32_t>(g.tensor_at(slot))]);
  if (py::isinstance<py::str>(tensor)) {
    const std::string name = tensor.cast<std::string>();
    for (uint32_t t = 0; t < 4; ++t)
      if (name == kTensorNames[t] && g.has_tensor_id(t)) return static_cast<PoolTensor>(t);
    raise(Errc::kInvalidArgument,
          fmt::format("tensor '{}' is not one of {} in this pool", name, present));
  }
  const long t = tensor.cast<long>();
  if (t < 0 || t > 3 || !g.has_tensor_id(static_cast<uint32_t>(t)))
    raise(Errc::kInvalidArgument,
          fmt::format("tensor {} is not in this pool, whose tensors are {} (ids 0..3: k, v, "
                      "k_scale, v_scale)",
                      t, present));
  return static_cast<PoolTensor>(t);
}

uint64_t PyPool::block_bytes(py::handle tensor) const {
  return geometry().block_bytes(to_tensor(tensor));
}

py::memoryview PyPool::block(uint32_t layer, py::handle tensor, uint32_t block_id) const {
  const PoolTensor t = to_tensor(tensor);
  std::byte* p = pool_->block(layer, t, block_id);
  const PoolGeometry& g = geometry();
  if (p == nullptr)
    raise(Errc::kInvalidArgument,
          fmt::format("no block {} in layer {}: the pool has {} layers and {} blocks in that "
                      "layer",
                      block_id, layer, g.total_layers(),
                      layer < g.total_layers() ? g.blocks_in_layer(layer) : 0));
  const py::object owner = py::cast(BlockBuffer{pool_, p, g.block_bytes(t)});
  PyObject* view = PyMemoryView_FromObject(owner.ptr());
  if (view == nullptr) throw py::error_already_set();
  return py::reinterpret_steal<py::memoryview>(view);
}

py::memoryview PyPool::tensor(uint32_t layer, py::handle tensor) const {
  const PoolTensor t = to_tensor(tensor);
  const PoolGeometry& g = geometry();
  std::byte* p = layer < g.total_layers() ? pool_->tensor(layer, t) : nullptr;
  if (p == nullptr)
    raise(Errc::kInvalidArgument,
          fmt::format("no layer {}: the pool has {} layers", layer, g.total_layers()));
  const py::object owner = py::cast(BlockBuffer{pool_, p, g.tensor_bytes(layer, t)});
  PyObject* view = PyMemoryView_FromObject(owner.ptr());
  if (view == nullptr) throw py::error_already_set();
  return py::reinterpret_steal<py::memoryview>(view);
}

void define_pool(py::module_& m) {
  py::class_<BlockBuffer>(m, "_BlockBuffer", py::buffer_protocol()).def_buffer([](BlockBuffer& b) {
    return py::buffer_info(b.data, 1, py::format_descriptor<uint8_t>::format(), 1,
                           {static_cast<py::ssize_t>(b.bytes)}, {1}, /*readonly=*/false);
  });

  py::class_<PyPool>(m, "Pool",
                     "One rank's host-memory KV pool (the host default's device memory, or the "
                     "host tier), mapped into this process.")
      .def_property_readonly("name", &PyPool::name, "the shared-memory segment's name")
      .def_property_readonly("num_layers", [](const PyPool& p) { return p.geometry().num_layers; })
      .def_property_readonly("extra_layers",
                             [](const PyPool& p) { return p.geometry().extra_layers; })
      .def_property_readonly("num_blocks", [](const PyPool& p) { return p.geometry().num_blocks; })
      .def_property_readonly("extra_layer_blocks",
                             [](const PyPool& p) { return p.geometry().extra_layer_blocks; })
      .def_property_readonly("kv_heads", [](const PyPool& p) { return p.geometry().kv_heads; })
      .def_property_readonly("block_size", [](const PyPool& p) { return p.geometry().block_size; })
      .def_property_readonly("head_dim", [](const PyPool& p) { return p.geometry().head_dim; })
      .def_property_readonly(
          "dtype",
          [](const PyPool& p) { return dtype_name(static_cast<CacheDtype>(p.geometry().dtype)); })
      .def_property_readonly("tensors",
                             [](const PyPool& p) {
                               py::list names;
                               const PoolGeometry& g = p.geometry();
                               for (uint32_t slot = 0; slot < g.tensors_per_layer(); ++slot)
                                 names.append(kTensorNames[static_cast<uint32_t>(g.tensor_at(slot))]);
                               return names;
                             })
      .def("block_bytes", &PyPool::block_bytes, py::arg("tensor") = "k",
           "Bytes of one block of `tensor`.")
      .def("tensor", &PyPool::tensor, py::arg("layer"), py::arg("tensor"),
           "A writable memoryview of a whole tensor of one layer ([num_blocks, kv_heads, "
           "block_size, head_dim] of the pool's dtype): the KV cache in place, e.g. "
           "torch.frombuffer(view, dtype=torch.bfloat16).view(...).")
      .def("block", &PyPool::block, py::arg("layer"), py::arg("tensor"), py::arg("block_id"),
           "A writable memoryview of one block of one tensor ('k', 'v', 'k_scale', 'v_scale' or "
           "0..3; a K-only pool has no 'v') of one layer.");
}

}  // namespace kvrelay::python
