#include "kernels/dmabuf.h"

#include <fmt/format.h>
#include <unistd.h>

#include "kernels/cuda/runtime.h"

namespace kvrelay::kernels {

Result<DmabufSpan> export_dmabuf(const std::byte* address) {
  Result<const cuda::DriverApi*> api = cuda::driver_api();
  if (!api) return api.error();
  const cuda::DriverApi& d = **api;
  if (d.mem_get_handle_for_address_range == nullptr)
    return make_error(Errc::kUnsupported,
                      "the CUDA driver cannot export dma-bufs (cuMemGetHandleForAddressRange "
                      "needs a driver for CUDA 11.7 or newer)");
  const auto at = reinterpret_cast<CUdeviceptr>(address);
  CUdeviceptr base = 0;
  size_t size = 0;
  if (Status s = cuda::check(d.mem_get_address_range(&base, &size, at), "cuMemGetAddressRange"); !s)
    return s.error();
  // The range must be whole host pages; an allocation's start is (it is
  // aligned far more coarsely), its reported size need not be.
  const auto page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  const size_t whole_pages = size / page * page;
  if (at >= base + whole_pages)
    return make_error(Errc::kUnsupported,
                      fmt::format("device address {:#x} lies in the last partial page of its "
                                  "allocation, which a dma-buf cannot cover",
                                  at));
  int fd = -1;
  if (Status s = cuda::check(
          d.mem_get_handle_for_address_range(&fd, base, whole_pages,
                                             CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0),
          fmt::format("cuMemGetHandleForAddressRange of {} bytes (dma-buf)", whole_pages));
      !s)
    return make_error(Errc::kUnsupported, s.error().message);
  DmabufSpan span;
  span.fd = UniqueFd(fd);
  span.offset = at - base;
  span.bytes = base + whole_pages - at;
  return span;
}

}  // namespace kvrelay::kernels
