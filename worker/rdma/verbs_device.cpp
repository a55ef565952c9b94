#include "worker/rdma/verbs_device.h"

#include <arpa/inet.h>
#include <fmt/format.h>

#include <array>
#include <cerrno>
#include <cstring>
#include <random>
#include <utility>

#include <fcntl.h>
#include <vector>

namespace kvrelay::worker::rdma {

namespace {

uint32_t mtu_bytes(ibv_mtu m) {
  switch (m) {
    case IBV_MTU_256: return 256;
    case IBV_MTU_512: return 512;
    case IBV_MTU_1024: return 1024;
    case IBV_MTU_2048: return 2048;
    case IBV_MTU_4096: return 4096;
  }
  return 1024;
}

ibv_mtu mtu_enum(uint32_t bytes) {
  if (bytes >= 4096) return IBV_MTU_4096;
  if (bytes >= 2048) return IBV_MTU_2048;
  if (bytes >= 1024) return IBV_MTU_1024;
  if (bytes >= 512) return IBV_MTU_512;
  return IBV_MTU_256;
}

Error verbs_error(const std::string& what, int err) {
  return system_error(what, err != 0 ? err : EIO);
}

}  // namespace

// ---- device ----

Result<std::unique_ptr<VerbsDevice>> VerbsDevice::open(const DeviceOptions& options) {
  int n = 0;
  ibv_device** list = ibv_get_device_list(&n);
  if (list == nullptr || n == 0) {
    if (list != nullptr) ibv_free_device_list(list);
    return make_error(Errc::kNotFound,
                      "no RDMA device on this host (ibv_get_device_list found none)");
  }
  ibv_device* chosen = nullptr;
  std::string names;
  for (int i = 0; i < n; ++i) {
    const char* name = ibv_get_device_name(list[i]);
    names += fmt::format("{}{}", names.empty() ? "" : ", ", name);
    if (chosen == nullptr && (options.name.empty() || options.name == name)) chosen = list[i];
  }
  if (chosen == nullptr) {
    ibv_free_device_list(list);
    return make_error(Errc::kNotFound,
                      fmt::format("no RDMA device '{}' (this host has {})", options.name, names));
  }
  std::unique_ptr<VerbsDevice> d(new VerbsDevice());
  d->options_ = options;
  d->name_ = ibv_get_device_name(chosen);
  d->context_ = ibv_open_device(chosen);
  ibv_free_device_list(list);
  if (d->context_ == nullptr)
    return verbs_error(fmt::format("ibv_open_device {}", d->name_), errno);
  d->pd_ = ibv_alloc_pd(d->context_);
  if (d->pd_ == nullptr) return verbs_error(fmt::format("ibv_alloc_pd on {}", d->name_), errno);
  if (int rc = ibv_query_port(d->context_, options.port, &d->port_); rc != 0)
    return verbs_error(fmt::format("ibv_query_port {} port {}", d->name_, options.port), rc);
  if (d->port_.state != IBV_PORT_ACTIVE)
    return make_error(Errc::kNotReady,
                      fmt::format("RDMA device {} port {} is not active", d->name_, options.port));
  if (d->roce()) {
    if (int rc = ibv_query_gid(d->context_, options.port, options.gid_index, &d->gid_); rc != 0)
      return verbs_error(fmt::format("ibv_query_gid {} port {} index {}", d->name_, options.port,
                                     options.gid_index),
                         rc);
  }
  return d;
}

VerbsDevice::~VerbsDevice() {
  if (pd_ != nullptr) ibv_dealloc_pd(pd_);
  if (context_ != nullptr) ibv_close_device(context_);
}

namespace {

int access_flags(RemoteAccess access) {
  return access == RemoteAccess::kWrite ? IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE
                                        : IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_MW_BIND;
}

}  // namespace

Result<std::unique_ptr<MemoryRegion>> VerbsDevice::register_memory(void* address, size_t bytes,
                                                                   RemoteAccess access) const {
  ibv_mr* mr = ibv_reg_mr(pd_, address, bytes, access_flags(access));
  if (mr == nullptr)
    return verbs_error(fmt::format("ibv_reg_mr of {} bytes on {}", bytes, name_), errno);
  return std::unique_ptr<MemoryRegion>(new MemoryRegion(mr));
}

Result<std::unique_ptr<MemoryRegion>> VerbsDevice::register_dmabuf(int fd, uint64_t offset,
                                                                   size_t bytes,
                                                                   uint64_t iova,
                                                                   RemoteAccess access) const {
  ibv_mr* mr = ibv_reg_dmabuf_mr(pd_, offset, bytes, iova, fd, access_flags(access));
  if (mr == nullptr)
    return verbs_error(fmt::format("ibv_reg_dmabuf_mr of {} bytes on {}", bytes, name_), errno);
  return std::unique_ptr<MemoryRegion>(new MemoryRegion(mr));
}

MemoryRegion::~MemoryRegion() {
  ibv_dereg_mr(mr_);
}

Status VerbsDevice::windows_supported() const {
  ibv_device_attr attr{};
  if (int rc = ibv_query_device(context_, &attr); rc != 0)
    return verbs_error(fmt::format("ibv_query_device {}", name_), rc);
  if (attr.max_mw == 0 || (attr.device_cap_flags & IBV_DEVICE_MEM_WINDOW_TYPE_2B) == 0)
    return make_error(Errc::kUnsupported,
                      fmt::format("RDMA device {} has no type-2 memory windows (max_mw {})", name_,
                                  attr.max_mw));
  return {};
}

Result<std::unique_ptr<MemoryWindow>> VerbsDevice::allocate_window() const {
  ibv_mw* mw = ibv_alloc_mw(pd_, IBV_MW_TYPE_2);
  if (mw == nullptr)
    return verbs_error(fmt::format("ibv_alloc_mw (type 2) on {}", name_), errno);
  return std::unique_ptr<MemoryWindow>(new MemoryWindow(mw));
}

MemoryWindow::~MemoryWindow() {
  ibv_dealloc_mw(mw_);
}

Result<std::unique_ptr<VerbsQueuePair>> VerbsDevice::create_queue_pair(
    const QueuePairOptions& options) const {
  std::unique_ptr<VerbsQueuePair> q(new VerbsQueuePair());
  q->device_ = this;
  q->options_ = options;
  q->channel_ = ibv_create_comp_channel(context_);
  if (q->channel_ == nullptr)
    return verbs_error(fmt::format("ibv_create_comp_channel on {}", name_), errno);
  // Non-blocking: arm() takes the events there are and never waits.
  if (int flags = fcntl(q->channel_->fd, F_GETFL); fcntl(q->channel_->fd, F_SETFL, flags | O_NONBLOCK) != 0)
    return verbs_error(fmt::format("O_NONBLOCK on {}'s completion channel", name_), errno);
  q->send_cq_ = ibv_create_cq(context_, static_cast<int>(options.max_send_wr), nullptr, q->channel_, 0);
  q->recv_cq_ = ibv_create_cq(context_, static_cast<int>(options.max_recv_wr), nullptr, q->channel_, 0);
  if (q->send_cq_ == nullptr || q->recv_cq_ == nullptr)
    return verbs_error(fmt::format("ibv_create_cq on {}", name_), errno);
  ibv_qp_init_attr init{};
  init.send_cq = q->send_cq_;
  init.recv_cq = q->recv_cq_;
  init.qp_type = IBV_QPT_RC;
  init.sq_sig_all = 0;
  init.cap.max_send_wr = options.max_send_wr;
  init.cap.max_recv_wr = options.max_recv_wr;
  init.cap.max_send_sge = 1;
  init.cap.max_recv_sge = 1;
  q->qp_ = ibv_create_qp(pd_, &init);
  if (q->qp_ == nullptr) return verbs_error(fmt::format("ibv_create_qp on {}", name_), errno);
  q->max_send_wr_ = init.cap.max_send_wr;  // what the device granted

  ibv_qp_attr attr{};
  attr.qp_state = IBV_QPS_INIT;
  attr.pkey_index = 0;
  attr.port_num = options_.port;
  attr.qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;
  if (int rc = ibv_modify_qp(q->qp_, &attr,
                             IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
      rc != 0)
    return verbs_error(fmt::format("{}: queue pair to INIT", name_), rc);

  q->local_.lid = port_.lid;
  q->local_.qpn = q->qp_->qp_num;
  q->local_.psn = std::random_device{}() & 0xffffff;
  std::memcpy(q->local_.gid.data(), gid_.raw, 16);
  q->local_.mtu = mtu_bytes(port_.active_mtu);
  q->name_ = fmt::format("{} qp {:#x}", name_, q->local_.qpn);
  return q;
}

// ---- queue pair ----

VerbsQueuePair::~VerbsQueuePair() {
  if (qp_ != nullptr) ibv_destroy_qp(qp_);
  // Events taken but not acknowledged would block ibv_destroy_cq.
  if (send_cq_ != nullptr) ibv_ack_cq_events(send_cq_, unacked_send_);
  if (recv_cq_ != nullptr) ibv_ack_cq_events(recv_cq_, unacked_recv_);
  if (send_cq_ != nullptr) ibv_destroy_cq(send_cq_);
  if (recv_cq_ != nullptr) ibv_destroy_cq(recv_cq_);
  if (channel_ != nullptr) ibv_destroy_comp_channel(channel_);
}

Status VerbsQueuePair::arm() {
  ibv_cq* cq = nullptr;
  void* context = nullptr;
  while (ibv_get_cq_event(channel_, &cq, &context) == 0) {
    if (cq == send_cq_) ++unacked_send_;
    if (cq == recv_cq_) ++unacked_recv_;
  }
  // Acknowledging is a lock per call: do it in batches.
  if (unacked_send_ >= 64) ibv_ack_cq_events(send_cq_, std::exchange(unacked_send_, 0));
  if (unacked_recv_ >= 64) ibv_ack_cq_events(recv_cq_, std::exchange(unacked_recv_, 0));
  for (ibv_cq* c : {send_cq_, recv_cq_})
    if (int rc = ibv_req_notify_cq(c, 0); rc != 0)
      return verbs_error(fmt::format("{}: ibv_req_notify_cq", name_), rc);
  return {};
}

Status VerbsQueuePair::connect(const QpEndpoint& remote) {
  const DeviceOptions& d = device_->options();
  ibv_qp_attr attr{};
  attr.qp_state = IBV_QPS_RTR;
  attr.path_mtu = mtu_enum(std::min(remote.mtu, local_.mtu));
  attr.dest_qp_num = remote.qpn;
  attr.rq_psn = remote.psn;
  attr.max_dest_rd_atomic = 1;
  attr.min_rnr_timer = 12;
  attr.ah_attr.port_num = d.port;
  if (device_->roce()) {
    attr.ah_attr.is_global = 1;
    std::memcpy(attr.ah_attr.grh.dgid.raw, remote.gid.data(), 16);
    attr.ah_attr.grh.sgid_index = static_cast<uint8_t>(d.gid_index);
    attr.ah_attr.grh.hop_limit = 64;
    attr.ah_attr.grh.traffic_class = d.traffic_class;
  } else {
    attr.ah_attr.dlid = remote.lid;
  }
  if (int rc = ibv_modify_qp(qp_, &attr,
                             IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
                                 IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
      rc != 0)
    return verbs_error(fmt::format("{}: to RTR (peer qp {:#x})", name_, remote.qpn), rc);
  attr = {};
  attr.qp_state = IBV_QPS_RTS;
  attr.timeout = options_.timeout;
  attr.retry_cnt = options_.retry_count;
  attr.rnr_retry = options_.rnr_retry;
  attr.sq_psn = local_.psn;
  attr.max_rd_atomic = 1;
  if (int rc = ibv_modify_qp(qp_, &attr,
                             IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                                 IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC);
      rc != 0)
    return verbs_error(fmt::format("{}: to RTS", name_), rc);
  return {};
}

Result<size_t> VerbsQueuePair::post_writes(std::span<const WriteRequest> writes) {
  if (writes.empty()) return size_t{0};
  std::array<ibv_send_wr, 64> wrs{};
  std::array<ibv_sge, 64> sges{};
  const size_t n = std::min(writes.size(), wrs.size());
  for (size_t i = 0; i < n; ++i) {
    const WriteRequest& w = writes[i];
    sges[i] = ibv_sge{w.local_address, w.length, w.lkey};
    ibv_send_wr& wr = wrs[i];
    wr.wr_id = w.wr_id;
    wr.sg_list = &sges[i];
    wr.num_sge = 1;
    wr.opcode = w.immediate ? IBV_WR_RDMA_WRITE_WITH_IMM : IBV_WR_RDMA_WRITE;
    if (w.immediate) wr.imm_data = htonl(*w.immediate);
    wr.send_flags = w.signaled ? IBV_SEND_SIGNALED : 0;
    wr.wr.rdma.remote_addr = w.remote_address;
    wr.wr.rdma.rkey = w.rkey;
    wr.next = i + 1 < n ? &wrs[i + 1] : nullptr;
  }
  ibv_send_wr* bad = nullptr;
  const int rc = ibv_post_send(qp_, wrs.data(), &bad);
  if (rc == 0) return n;
  // ENOMEM: the send queue is full from `bad` on; the caller posts the
  // rest again later.
  if (rc == ENOMEM && bad != nullptr) return static_cast<size_t>(bad - wrs.data());
  return verbs_error(fmt::format("{}: ibv_post_send", name_), rc);
}

Status VerbsQueuePair::post_bind(Window& any_window, const Registration& any_region,
                                 uint64_t address, uint64_t bytes, uint64_t wr_id, bool signaled) {
  auto& window = static_cast<MemoryWindow&>(any_window);
  const auto& region = static_cast<const MemoryRegion&>(any_region);
  const uint32_t rkey = ibv_inc_rkey(window.rkey_);
  ibv_send_wr wr{};
  wr.wr_id = wr_id;
  wr.opcode = IBV_WR_BIND_MW;
  wr.send_flags = signaled ? IBV_SEND_SIGNALED : 0;
  wr.bind_mw.mw = window.mw_;
  wr.bind_mw.rkey = rkey;
  wr.bind_mw.bind_info.mr = region.mr_;
  wr.bind_mw.bind_info.addr = address;
  wr.bind_mw.bind_info.length = bytes;
  wr.bind_mw.bind_info.mw_access_flags = IBV_ACCESS_REMOTE_WRITE;
  ibv_send_wr* bad = nullptr;
  if (int rc = ibv_post_send(qp_, &wr, &bad); rc != 0)
    return verbs_error(fmt::format("{}: ibv_post_send of a window bind", name_), rc);
  // The next bind names the window by its current key (the provider reads
  // it from the ibv_mw: a stale one fails as 'memory management operation
  // error'), and verbs leaves keeping it to the application for type 2.
  window.mw_->rkey = rkey;
  window.rkey_ = rkey;
  return {};
}

Status VerbsQueuePair::post_invalidate(uint32_t rkey, uint64_t wr_id, bool signaled) {
  ibv_send_wr wr{};
  wr.wr_id = wr_id;
  wr.opcode = IBV_WR_LOCAL_INV;
  wr.send_flags = signaled ? IBV_SEND_SIGNALED : 0;
  wr.invalidate_rkey = rkey;
  ibv_send_wr* bad = nullptr;
  if (int rc = ibv_post_send(qp_, &wr, &bad); rc != 0)
    return verbs_error(fmt::format("{}: ibv_post_send of a window invalidation", name_), rc);
  return {};
}

Status VerbsQueuePair::post_receive(uint64_t wr_id) {
  ibv_recv_wr wr{};
  wr.wr_id = wr_id;
  wr.num_sge = 0;  // a WRITE_WITH_IMM delivers only its immediate here
  ibv_recv_wr* bad = nullptr;
  if (int rc = ibv_post_recv(qp_, &wr, &bad); rc != 0)
    return verbs_error(fmt::format("{}: ibv_post_recv", name_), rc);
  return {};
}

size_t VerbsQueuePair::poll(ibv_cq* cq, std::span<WorkCompletion> out) {
  std::array<ibv_wc, 64> wcs{};
  const int n = ibv_poll_cq(cq, static_cast<int>(std::min(out.size(), wcs.size())), wcs.data());
  if (n <= 0) return 0;
  for (int i = 0; i < n; ++i) {
    const ibv_wc& wc = wcs[i];
    WorkCompletion& c = out[i];
    c = {};
    c.wr_id = wc.wr_id;
    c.ok = wc.status == IBV_WC_SUCCESS;
    if (!c.ok) c.status = ibv_wc_status_str(wc.status);
    if ((wc.wc_flags & IBV_WC_WITH_IMM) != 0) c.immediate = ntohl(wc.imm_data);
    c.byte_len = wc.byte_len;
  }
  return static_cast<size_t>(n);
}

size_t VerbsQueuePair::poll_send(std::span<WorkCompletion> out) {
  return poll(send_cq_, out);
}

size_t VerbsQueuePair::poll_receive(std::span<WorkCompletion> out) {
  return poll(recv_cq_, out);
}

}  // namespace kvrelay::worker::rdma
