#include "metrics_server.h"

#include <fmt/format.h>

#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/read_until.hpp>
#include <boost/asio/signal_set.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/streambuf.hpp>
#include <boost/asio/write.hpp>
#include <memory>

namespace kvrelay::dump {

namespace asio = boost::asio;
using asio::ip::tcp;

namespace {

constexpr size_t kMaxRequestBytes = 8192;
constexpr auto kRequestTimeout = std::chrono::seconds(5);

std::string reason_of(int status) {
  switch (status) {
    case 200: return "OK";
    case 400: return "Bad Request";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 503: return "Service Unavailable";
  }
  return "Error";
}

class Connection : public std::enable_shared_from_this<Connection> {
 public:
  Connection(tcp::socket socket, const std::function<MetricsBody()>& render)
      : socket_(std::move(socket)),
        timer_(socket_.get_executor()),
        buffer_(kMaxRequestBytes),
        render_(render) {}

  void start() {
    auto self = shared_from_this();
    timer_.expires_after(kRequestTimeout);
    timer_.async_wait([self](const boost::system::error_code& ec) {
      if (!ec) self->socket_.close();  // too slow: dropped
    });
    asio::async_read_until(socket_, buffer_, "\r\n\r\n",
                           [self](const boost::system::error_code& ec, size_t) {
                             if (ec == asio::error::not_found) return self->answer(400, "", false);
                             if (ec) {
                               self->timer_.cancel();
                               return;
                             }
                             self->respond();
                           });
  }

 private:
  void respond() {
    std::istream in(&buffer_);
    std::string method, target, version;
    in >> method >> target >> version;
    if (version.rfind("HTTP/1.", 0) != 0) return answer(400, "not an HTTP/1 request\n", false);
    const bool head = method == "HEAD";
    if (method != "GET" && !head) return answer(405, "only GET and HEAD\n", false);
    const std::string path = target.substr(0, target.find('?'));
    if (path == "/") return answer(200, "kvrelay-dump: the metrics are at /metrics\n", head);
    if (path != "/metrics") return answer(404, "not found: the metrics are at /metrics\n", head);
    MetricsBody body = render_();
    answer(body.status, body.text, head);
  }

  void answer(int status, const std::string& body, bool head_only) {
    response_ = fmt::format(
        "HTTP/1.1 {} {}\r\nContent-Type: {}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        status, reason_of(status),
        status == 200 ? "text/plain; version=0.0.4; charset=utf-8" : "text/plain; charset=utf-8",
        body.size());
    if (!head_only) response_ += body;
    auto self = shared_from_this();
    asio::async_write(socket_, asio::buffer(response_),
                      [self](const boost::system::error_code&, size_t) {
                        boost::system::error_code ignored;
                        self->socket_.shutdown(tcp::socket::shutdown_both, ignored);
                        self->socket_.close(ignored);
                        self->timer_.cancel();
                      });
  }

  tcp::socket socket_;
  asio::steady_timer timer_;
  asio::streambuf buffer_;
  const std::function<MetricsBody()>& render_;
  std::string response_;
};

void accept_next(tcp::acceptor& acceptor, const std::function<MetricsBody()>& render) {
  acceptor.async_accept(
      [&acceptor, &render](const boost::system::error_code& ec, tcp::socket socket) {
        if (ec == asio::error::operation_aborted) return;
        if (!ec) std::make_shared<Connection>(std::move(socket), render)->start();
        accept_next(acceptor, render);
      });
}

}  // namespace

Result<ListenAddress> parse_listen_address(const std::string& text) {
  const size_t colon = text.rfind(':');
  if (colon == std::string::npos)
    return make_error(
        Errc::kInvalidArgument,
        fmt::format("--serve '{}': expected ADDRESS:PORT, e.g. 127.0.0.1:9400", text));
  ListenAddress a;
  a.host = text.substr(0, colon);
  if (a.host.size() >= 2 && a.host.front() == '[' && a.host.back() == ']')
    a.host = a.host.substr(1, a.host.size() - 2);
  if (a.host.empty()) a.host = "0.0.0.0";
  const std::string port = text.substr(colon + 1);
  char* end = nullptr;
  const unsigned long p = std::strtoul(port.c_str(), &end, 10);
  if (port.empty() || *end != '\0' || p > 65535)
    return make_error(Errc::kInvalidArgument,
                      fmt::format("--serve '{}': '{}' is not a port (0-65535)", text, port));
  a.port = static_cast<uint16_t>(p);
  boost::system::error_code ec;
  asio::ip::make_address(a.host, ec);
  if (ec)
    return make_error(Errc::kInvalidArgument,
                      fmt::format("--serve '{}': '{}' is not an IP address", text, a.host));
  return a;
}

Status serve_metrics(const ListenAddress& at, const std::function<MetricsBody()>& render,
                     const std::function<void(uint16_t)>& ready) {
  asio::io_context io;
  tcp::acceptor acceptor(io);
  boost::system::error_code ec;
  const tcp::endpoint endpoint(asio::ip::make_address(at.host), at.port);
  if (acceptor.open(endpoint.protocol(), ec); !ec)
    acceptor.set_option(tcp::acceptor::reuse_address(true), ec);
  if (!ec) acceptor.bind(endpoint, ec);
  if (!ec) acceptor.listen(asio::socket_base::max_listen_connections, ec);
  if (ec)
    return make_error(Errc::kSystem,
                      fmt::format("cannot listen on {}:{}: {}", at.host, at.port, ec.message()));
  ready(acceptor.local_endpoint().port());
  asio::signal_set stop(io, SIGINT, SIGTERM);
  stop.async_wait([&](const boost::system::error_code&, int) {
    acceptor.close();
    io.stop();
  });
  accept_next(acceptor, render);
  io.run();
  return {};
}

}  // namespace kvrelay::dump
