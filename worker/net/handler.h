// What a transport registers with a listener (listener.h): a factory that
// makes a MessageHandler for each connection that carries its messages, and
// what that handler may do with the connection (ServerLink). The listener
// knows a transport only as a protocol number and a name.
//
// Everything here runs on the connection's strand.
#pragma once

#include <boost/asio/any_io_executor.hpp>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "worker/net/channel.h"
#include "worker/net/envelope.h"

namespace kvrelay::worker::net {

// An authenticated connection, as a handler sees it.
class ServerLink {
 public:
  virtual ~ServerLink() = default;
  virtual void send(Outgoing message) = 0;
  // Done with the current message: read the next one.
  virtual void read_next() = 0;
  // The current message's payload, into `dst` (or dropped); `then` runs once
  // it has all landed and its tag checked. A payload read in pieces (into
  // staging slots) is one record: `first` and `last` mark its ends, and the
  // tag is checked after the last.
  virtual void read_payload(std::byte* dst, uint64_t bytes, std::function<void()> then,
                            bool first = true, bool last = true) = 0;
  // One payload landing in several places, in order (a frame of several
  // runs): one record, `then` once all of it landed and its tag checked.
  virtual void read_scattered(std::span<const iovec> pieces, std::function<void()> then) = 0;
  virtual void discard_payload(uint64_t bytes, std::function<void()> then) = 0;
  virtual void close(const std::string& reason) = 0;
  virtual bool closed() const = 0;
  virtual const std::string& peer_name() const = 0;
  // The peer's hello: its instance, rank and pool, proved by the key.
  virtual const Hello& hello() const = 0;
  virtual boost::asio::any_io_executor executor() = 0;
  // Keeps the connection (and its handlers) alive, for work another thread
  // finishes: post back to executor() with it.
  virtual std::shared_ptr<void> keep_alive() = 0;
  // Messages queued and not yet written.
  virtual size_t queued() const = 0;
};

class MessageHandler {
 public:
  virtual ~MessageHandler() = default;
  // One message of the handler's protocol: it ends by calling
  // read_next() (perhaps after a payload) or close().
  virtual void on_message(const Inbound& in) = 0;
  // The connection closed (once); nothing more arrives.
  virtual void on_closed(const std::string& reason) = 0;
};

struct HandlerFactory {
  uint8_t protocol = 0;  // TransportMessage.protocol
  const char* name = "";
  // Made once the handshake succeeds, before the helloAck goes out (a
  // handler that prepares something the sender should not wait for later),
  // rather than with the connection's first message of this protocol.
  bool at_handshake = false;
  std::function<std::unique_ptr<MessageHandler>(ServerLink& link)> make;
};

}  // namespace kvrelay::worker::net
