// kvrelay-dump --serve ADDR:PORT: the --prometheus text over HTTP, for a
// scraper. GET /metrics renders it afresh for every request (the instance is
// attached anew each time, so a restarted instance is followed); HEAD answers
// the headers; any other path is 404 and any other method 405. Each
// connection gets one answer and is closed; a request line and headers over
// 8 KiB, or not complete within 5 s, are answered 400 or dropped. One thread
// (Boost.Asio), since a scraper asks every few seconds.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "shm/result.h"

namespace kvrelay::dump {

struct MetricsBody {
  int status = 200;  // 200, or 503 when the instance cannot be read
  std::string text;
};

// "127.0.0.1:9400", "[::1]:9400", ":9400" (all addresses); port 0: any free one.
struct ListenAddress {
  std::string host;
  uint16_t port = 0;
};
Result<ListenAddress> parse_listen_address(const std::string& text);

// Serves until SIGINT or SIGTERM; `ready` is told the bound port first.
// Returns an error when it cannot listen.
Status serve_metrics(const ListenAddress& at, const std::function<MetricsBody()>& render,
                     const std::function<void(uint16_t port)>& ready);

}  // namespace kvrelay::dump
