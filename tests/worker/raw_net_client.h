// A peer that speaks the network protocol (worker/net/) by hand over a
// blocking socket, so that tests can send what kvrelay's own peers never do:
// out-of-range frames, silence, floods, and the attacks of a hostile peer
// (with or without the key). Every byte it writes goes through write_raw(),
// so a test can also corrupt, inject or replay bytes.
#pragma once

#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/read.hpp>
#include <boost/asio/write.hpp>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "instance/auth_key.h"
#include "worker/net/envelope.h"
#include "worker/net/session_seal.h"

namespace kvrelay::testing {

class RawNetClient {
 public:
  explicit RawNetClient(uint16_t port, const std::string& host = "127.0.0.1") : socket_(io_) {
    socket_.connect({boost::asio::ip::make_address(host), port});
  }

  static worker::net::Hello raw_hello(const PoolGeometry& pool = {}) {
    worker::net::Hello h;
    h.version = worker::net::kWireVersion;
    h.instance = "raw";
    h.rank = 0;
    h.tp_size = 1;
    h.pool = pool;
    return h;
  }

  // The next message other than a heartbeat.
  Result<worker::net::Inbound> read() {
    Result<worker::net::Inbound> in = read_any();
    while (in && in->kind == schema::NetEnvelope::HEARTBEAT)
      in = read_any();
    return in;
  }
  // The next message; in a session, its tag is checked. A transport
  // message's body stays valid until the next read.
  Result<worker::net::Inbound> read_any() {
    uint8_t p[4];
    boost::system::error_code ec;
    boost::asio::read(socket_, boost::asio::buffer(p), ec);
    if (ec) return make_error(Errc::kSystem, ec.message());
    Result<uint32_t> len = worker::net::parse_length(std::span<const uint8_t, 4>(p, 4));
    if (!len) return len.error();
    body_.assign(*len / 8, 0);
    auto* body = reinterpret_cast<std::byte*>(body_.data());
    boost::asio::read(socket_, boost::asio::buffer(body, *len), ec);
    if (ec) return make_error(Errc::kSystem, ec.message());
    if (receive_) {
      uint8_t tag[worker::net::kTagBytes];
      boost::asio::read(socket_, boost::asio::buffer(tag), ec);
      if (ec) return make_error(Errc::kSystem, ec.message());
      receive_->begin();
      receive_->add_plain(std::span<const std::byte>(reinterpret_cast<const std::byte*>(p), 4));
      receive_->add(std::span<const std::byte>(body, *len), body);
      if (!receive_->finish_receive(std::span<const uint8_t, worker::net::kTagBytes>(tag)))
        return make_error(Errc::kCorrupt, "a record from the listener failed its tag");
    }
    return worker::net::decode_envelope(std::span<const std::byte>(body, *len));
  }
  void write_raw(std::span<const std::byte> bytes) {
    boost::asio::write(socket_, boost::asio::buffer(bytes.data(), bytes.size()));
  }
  // Sends envelopes encoded back to back (and a payload after the last), sealed
  // once the session has begun. Returns the bytes as they went on the wire.
  std::vector<std::byte> send(std::vector<std::byte> envelopes,
                              std::span<const std::byte> payload = {}) {
    std::vector<std::byte> wire;
    for (size_t at = 0; at < envelopes.size();) {
      const auto* b = reinterpret_cast<const uint8_t*>(envelopes.data() + at);
      const size_t size =
          4 + (uint32_t{b[0]} | uint32_t{b[1]} << 8 | uint32_t{b[2]} << 16 | uint32_t{b[3]} << 24);
      std::byte* env = envelopes.data() + at;
      if (send_) {
        send_->begin();
        send_->add_plain(std::span<const std::byte>(env, 4));
        send_->add(std::span<const std::byte>(env + 4, size - 4), env + 4);
        const worker::net::Tag tag = send_->finish_send();
        wire.insert(wire.end(), env, env + size);
        const auto* t = reinterpret_cast<const std::byte*>(tag.data());
        wire.insert(wire.end(), t, t + tag.size());
      } else {
        wire.insert(wire.end(), env, env + size);
      }
      at += size;
    }
    if (!payload.empty()) {
      const std::vector<std::byte> sealed = seal_payload(payload);
      wire.insert(wire.end(), sealed.begin(), sealed.end());
    }
    write_raw(wire);
    return wire;
  }
  // A payload as the session would send it (sealed, its tag after it),
  // without writing it: a test may alter it first.
  std::vector<std::byte> seal_payload(std::span<const std::byte> payload) {
    std::vector<std::byte> sealed(payload.begin(), payload.end());
    if (send_) {
      send_->begin();
      send_->add(payload, sealed.data());
      const worker::net::Tag tag = send_->finish_send();
      const auto* t = reinterpret_cast<const std::byte*>(tag.data());
      sealed.insert(sealed.end(), t, t + tag.size());
    }
    return sealed;
  }

  // The whole handshake with `key`: answers the challenge, checks the
  // listener's proof, starts the session and says `hello`. Returns the
  // listener's helloAck (or why there was none).
  Result<worker::net::Inbound> authenticate(
      const AuthKey& key, worker::net::Hello hello = raw_hello(),
      worker::net::Protection mode = worker::net::Protection::kAuthenticate) {
    Result<worker::net::Inbound> challenge = read();
    if (!challenge) return challenge;
    const Nonce mine = random_nonce();
    const uint8_t modes[1] = {static_cast<uint8_t>(mode)};
    std::vector<std::byte> out;
    worker::net::encode_proof(mine, mode, key.mac(kConnectLabel, {challenge->nonce, mine, modes}),
                              out);
    write_raw(out);
    Result<worker::net::Inbound> proof = read();
    if (!proof) return proof;
    if (proof->kind != schema::NetEnvelope::SERVER_PROOF)
      return make_error(Errc::kInvalidArgument, "no server proof");
    if (!key.verify(kAcceptLabel, {mine, challenge->nonce, modes}, proof->mac))
      return make_error(Errc::kInvalidArgument, "the server proof is wrong");
    start_session(worker::net::derive_session_keys(key, challenge->nonce, mine, mode), mode);
    out.clear();
    worker::net::encode_hello(hello, out);
    send(std::move(out));
    return read();
  }
  void start_session(const worker::net::SessionKeys& keys, worker::net::Protection mode) {
    send_ = std::make_unique<worker::net::RecordSeal>(keys.client_to_server, mode,
                                                      worker::net::RecordSeal::Side::kSend);
    receive_ = std::make_unique<worker::net::RecordSeal>(keys.server_to_client, mode,
                                                         worker::net::RecordSeal::Side::kReceive);
  }
  boost::asio::ip::tcp::socket& socket() { return socket_; }

 private:
  boost::asio::io_context io_;
  boost::asio::ip::tcp::socket socket_;
  std::vector<uint64_t> body_;
  std::unique_ptr<worker::net::RecordSeal> send_, receive_;
};

}  // namespace kvrelay::testing
