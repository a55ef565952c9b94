#include "worker/rdma/endpoint_codec.h"

#include <fmt/format.h>

#include <cstring>

namespace kvrelay::worker::rdma {

namespace {

Error invalid(std::string message) {
  return make_error(Errc::kInvalidArgument, std::move(message));
}

}  // namespace

void encode_endpoint(const QpEndpoint& e, schema::RdmaQpInfo::Builder out) {
  out.setLid(e.lid);
  out.setQpn(e.qpn);
  out.setPsn(e.psn);
  out.setGid(kj::arrayPtr(reinterpret_cast<const kj::byte*>(e.gid.data()), e.gid.size()));
  out.setMtu(e.mtu);
}

Result<QpEndpoint> decode_endpoint(schema::RdmaQpInfo::Reader in) {
  QpEndpoint e;
  if (in.getQpn() == 0 || in.getQpn() > 0xffffff)
    return invalid(
        fmt::format("RdmaQpInfo: qpn {:#x} is not a 24-bit queue pair number", in.getQpn()));
  if (in.getPsn() > 0xffffff)
    return invalid(fmt::format("RdmaQpInfo: psn {:#x} is over 24 bits", in.getPsn()));
  const uint32_t mtu = in.getMtu();
  if (mtu < 256 || mtu > 4096 || (mtu & (mtu - 1)) != 0)
    return invalid(fmt::format("RdmaQpInfo: mtu {} is not 256, 512, 1024, 2048 or 4096", mtu));
  const auto gid = in.getGid();
  if (gid.size() != e.gid.size())
    return invalid(fmt::format("RdmaQpInfo: gid is {} bytes, not 16", gid.size()));
  e.lid = in.getLid();
  e.qpn = in.getQpn();
  e.psn = in.getPsn();
  std::memcpy(e.gid.data(), gid.begin(), e.gid.size());
  e.mtu = mtu;
  return e;
}

void encode_regions(const PoolGeometry& g, const std::vector<RemoteTensor>& tensors,
                    schema::RdmaMemoryRegions::Builder out) {
  const uint32_t per_layer = g.tensors_per_layer();
  auto list = out.initRegions(static_cast<unsigned>(tensors.size()));
  for (unsigned i = 0; i < tensors.size(); ++i) {
    auto r = list[i];
    r.setLayer(i / per_layer);
    r.setTensor(static_cast<uint32_t>(g.tensor_at(i % per_layer)));  // on the wire by its id
    r.setAddress(tensors[i].address);
    r.setRkey(0);  // keys come only in grants, scoped to them (RdmaGrant)
    r.setBytes(tensors[i].bytes);
  }
}

std::vector<RegionEntry> copy_regions(schema::RdmaMemoryRegions::Reader in) {
  std::vector<RegionEntry> out;
  out.reserve(in.getRegions().size());
  for (const auto r : in.getRegions())
    out.push_back({r.getLayer(), r.getTensor(), r.getAddress(), r.getBytes()});
  return out;
}

Result<RemoteTensors> decode_regions(schema::RdmaMemoryRegions::Reader in, const PoolGeometry& g) {
  return check_regions(copy_regions(in), g);
}

Result<RemoteTensors> check_regions(std::span<const RegionEntry> regions, const PoolGeometry& g) {
  RemoteTensors out;
  out.tensors_per_layer_ = g.tensors_per_layer();
  const uint64_t want = uint64_t{g.total_layers()} * out.tensors_per_layer_;
  if (regions.size() != want)
    return invalid(
        fmt::format("RdmaMemoryRegions: {} regions, but the pool has {} tensors "
                    "({} layers x {})",
                    regions.size(), want, g.total_layers(), out.tensors_per_layer_));
  out.tensors_.assign(want, RemoteTensors::Span{});
  for (size_t i = 0; i < regions.size(); ++i) {
    const RegionEntry& r = regions[i];
    if (r.layer >= g.total_layers() || !g.has_tensor_id(r.tensor))
      return invalid(
          fmt::format("RdmaMemoryRegions: region {} names layer {} tensor {}, which "
                      "the pool does not have",
                      i, r.layer, r.tensor));
    const uint64_t size = g.tensor_bytes(r.layer, static_cast<PoolTensor>(r.tensor));
    if (r.bytes != size)
      return invalid(
          fmt::format("RdmaMemoryRegions: layer {} tensor {} is {} bytes, not the "
                      "pool's {}",
                      r.layer, r.tensor, r.bytes, size));
    if (r.address == 0 || r.address + size < r.address)
      return invalid(
          fmt::format("RdmaMemoryRegions: layer {} tensor {} at {:#x} is not a usable "
                      "address range",
                      r.layer, r.tensor, r.address));
    RemoteTensors::Span& t =
        out.tensors_[uint64_t{r.layer} * out.tensors_per_layer_ +
                     g.slot_of(static_cast<PoolTensor>(r.tensor))];
    if (t.address != 0)
      return invalid(fmt::format("RdmaMemoryRegions: layer {} tensor {} is given twice", r.layer,
                                 r.tensor));
    t = RemoteTensors::Span{r.address, size};
  }
  return out;
}

Result<uint64_t> RemoteTensors::address(uint32_t layer, uint32_t tensor, uint64_t offset,
                                        uint64_t length) const {
  const uint64_t index = uint64_t{layer} * tensors_per_layer_ + tensor;
  if (tensor >= tensors_per_layer_ || index >= tensors_.size())
    return invalid(fmt::format("no remote tensor {} in layer {}", tensor, layer));
  const Span& t = tensors_[index];
  if (offset > t.bytes || length > t.bytes - offset)
    return invalid(fmt::format("bytes [{}, +{}) fall outside layer {} tensor {} ({} bytes)", offset,
                               length, layer, tensor, t.bytes));
  return t.address + offset;
}

}  // namespace kvrelay::worker::rdma
