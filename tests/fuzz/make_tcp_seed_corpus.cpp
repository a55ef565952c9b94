// Writes the checked-in seed corpus of tcp_wire_fuzzer: streams a real peer
// writes (the handshake's messages, frames with payloads, acks, heartbeats,
// an rdma session's control messages), as they read once unsealed.
// Run: make_tcp_seed_corpus <dir>.
#include <cstdio>
#include <string>
#include <vector>

#include "worker/net/envelope.h"
#include "worker/rdma/control_wire.h"
#include "worker/request_key.h"
#include "worker/tcp/frame_wire.h"

using namespace kvrelay;
using namespace kvrelay::worker::tcp;
namespace net = kvrelay::worker::net;
namespace rdma = kvrelay::worker::rdma;

namespace {

void write(const std::string& path, const std::vector<std::byte>& bytes) {
  FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) return;
  std::fwrite(bytes.data(), 1, bytes.size(), f);
  std::fclose(f);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: make_tcp_seed_corpus <dir>\n");
    return 2;
  }
  const std::string dir = argv[1];
  Nonce nonce{};
  Mac mac{};
  for (size_t i = 0; i < nonce.size(); ++i)
    nonce[i] = static_cast<uint8_t>(i);
  std::vector<std::byte> handshake;
  net::encode_challenge(nonce, net::Protection::kAuthenticate, handshake);
  net::encode_proof(nonce, net::Protection::kAuthenticate, mac, handshake);
  net::encode_server_proof(mac, handshake);
  net::Hello hello;
  hello.version = net::kWireVersion;
  hello.instance = "prefill";
  hello.expected_instance = "fuzz";
  hello.pool.num_layers = 4;
  hello.pool.extra_layers = 1;
  hello.pool.num_blocks = 64;
  hello.pool.extra_layer_blocks = 16;
  hello.pool.kv_heads = 2;
  hello.pool.block_size = 16;
  hello.pool.head_dim = 64;
  hello.pool.has_scales = 1;
  net::encode_hello(hello, handshake);
  net::HelloAck ack;
  ack.accepted = true;
  ack.pool = hello.pool;
  net::encode_hello_ack(ack, handshake);
  write(dir + "/handshake", handshake);

  std::vector<std::byte> frames;
  const uint64_t block = 2 * 16 * 64 * 2;
  for (uint32_t t = 0; t < 2; ++t) {
    FrameHeader f;
    f.transfer = 1;
    f.handle = 7;
    f.layer = 1;
    f.tensor = t;
    f.dst_offset = 3 * block;
    f.bytes = block;
    f.last = t == 1;
    encode_frame(f, frames);
    frames.resize(frames.size() + block, std::byte{0x5a});
  }
  {  // a frame of several runs: scattered blocks under one tag
    FrameHeader f;
    f.transfer = 2;
    f.layer = 2;
    f.bytes = 3 * block;
    f.last = true;
    const std::vector<FrameRun> runs = {{9 * block, block}, {1 * block, 2 * block}};
    encode_frame(f, runs, frames);
    frames.resize(frames.size() + f.bytes, std::byte{0x5b});
  }
  net::encode_heartbeat(frames);
  encode_ack(1, true, "", frames);
  encode_ack(2, false, "refused", frames);
  write(dir + "/frames", frames);

  // An rdma session: offer, accept with the pool's regions, intents (one for
  // the declared request's blocks, one for blocks out of range), grants, acks.
  std::vector<std::byte> rdma_stream;
  rdma::QpEndpoint qp;
  qp.qpn = 0x11;
  qp.psn = 0x123;
  qp.mtu = 4096;
  qp.gid[15] = 1;
  const std::vector<rdma::QpEndpoint> qps = {qp, qp};
  rdma::encode_offer(qps, rdma_stream);
  std::vector<rdma::RemoteTensor> tensors;
  for (uint32_t l = 0; l < hello.pool.total_layers(); ++l)
    for (uint32_t t = 0; t < hello.pool.tensors_per_layer(); ++t)
      tensors.push_back({0x100000 + (l * 4 + t) * 0x10000, 7,
                         hello.pool.tensor_bytes(l, static_cast<PoolTensor>(t))});
  rdma::encode_accept(true, "", qps, hello.pool, tensors, rdma_stream);
  rdma::Intent intent;
  intent.transfer = 1;
  intent.request_key = worker::request_key("fuzz-declared");
  intent.layer = 2;
  intent.runs = {{3, 3}};
  rdma::encode_intent(intent, rdma_stream);
  intent.transfer = 2;
  intent.runs = {{60, 8}};
  intent.last = false;
  rdma::encode_intent(intent, rdma_stream);
  intent.runs = {{1, 1}};
  intent.last = true;
  rdma::encode_intent(intent, rdma_stream);
  rdma::Grant grant;
  grant.transfer = 1;
  grant.ok = true;
  grant.rkeys = {7, 7};  // one run, K and V
  rdma::encode_grant(grant, rdma_stream);
  grant.transfer = 2;
  grant.ok = false;
  grant.reason = "refused";
  grant.rkeys.clear();
  rdma::encode_grant(grant, rdma_stream);
  rdma::encode_ack(1, true, "", rdma_stream);
  write(dir + "/rdma", rdma_stream);
  return 0;
}
