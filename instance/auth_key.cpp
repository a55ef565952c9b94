#include "instance/auth_key.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <stdexcept>

namespace kvrelay {

namespace {

const char* file_type_name(mode_t mode) {
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a regular file";
}

// How many bits of secret the key's bytes can carry at most, judged by the
// alphabet they are drawn from (a trailing newline, as `echo` or base64
// leave, is not counted): hex digits 4 bits a byte, base64 6, printable
// text about 6.6, anything else 8. An estimate from above: it catches keys
// that are obviously weak (a password, a repeated byte), not every weak one.
double estimated_bits(std::span<const uint8_t> key, size_t* distinct) {
  while (!key.empty() && (key.back() == '\n' || key.back() == '\r'))
    key = key.first(key.size() - 1);
  bool seen[256] = {};
  bool hex = true, base64 = true, printable = true;
  *distinct = 0;
  for (uint8_t c : key) {
    if (!seen[c]) ++*distinct;
    seen[c] = true;
    hex = hex && std::isxdigit(c);
    base64 = base64 && (std::isalnum(c) || c == '+' || c == '/' || c == '=' || c == '-' ||
                        c == '_');
    printable = printable && c >= 0x20 && c < 0x7f;
  }
  const double per_byte = hex ? 4.0 : base64 ? 6.0 : printable ? std::log2(95.0) : 8.0;
  return per_byte * static_cast<double>(key.size());
}

}  // namespace

Status check_key_strength(std::span<const uint8_t> key, const std::string& path) {
  size_t distinct = 0;
  const double bits = estimated_bits(key, &distinct);
  const std::string how = fmt::format(
      "make one with: head -c 32 /dev/urandom > {}; chmod 600 {}", path, path);
  if (distinct < kMinDistinctKeyBytes)
    return make_error(Errc::kInvalidArgument,
                      fmt::format("the auth key file {} is a weak key: only {} distinct byte "
                                  "values ({})",
                                  path, distinct, how));
  if (bits < kMinKeyBits)
    return make_error(Errc::kInvalidArgument,
                      fmt::format("the auth key file {} is a weak key: its {} bytes of text carry "
                                  "at most about {:.0f} bits, and a key needs {} ({})",
                                  path, key.size(), bits, kMinKeyBits, how));
  return {};
}

Result<AuthKey> AuthKey::load(const std::string& path) {
  // A link (a Kubernetes secret volume presents every key as one) is
  // followed to its target, whose owner and mode are what count; messages
  // name both.
  std::string target = path;
  struct stat link_st {};
  if (::lstat(path.c_str(), &link_st) == 0 && S_ISLNK(link_st.st_mode)) {
    char* resolved = ::realpath(path.c_str(), nullptr);
    if (resolved == nullptr)
      return make_error(Errc::kInvalidArgument,
                        fmt::format("the auth key file {} is a symbolic link that does not lead "
                                    "to a file: {}",
                                    path, std::strerror(errno)));
    target = resolved;
    std::free(resolved);
  }
  const std::string named =
      target == path ? path : fmt::format("{} (a link to {})", path, target);
  // O_NONBLOCK: opening a FIFO would otherwise wait for a writer, hanging
  // the process before the type check could refuse it. O_NOFOLLOW: the
  // target was resolved above; a link swapped in meanwhile is refused.
  const int fd = ::open(target.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
  if (fd < 0)
    return make_error(Errc::kInvalidArgument, fmt::format("cannot open the auth key file {}: {}",
                                                          named, std::strerror(errno)));
  struct stat st {};
  std::vector<uint8_t> bytes;
  Status status;
  if (::fstat(fd, &st) != 0) {
    status = make_error(Errc::kSystem, fmt::format("fstat {}: {}", named, std::strerror(errno)));
  } else if (!S_ISREG(st.st_mode)) {
    status = make_error(Errc::kInvalidArgument,
                        fmt::format("the auth key file {} is {}; a key is a regular file", named,
                                    file_type_name(st.st_mode)));
  } else if (st.st_uid != ::geteuid()) {
    status = make_error(Errc::kPermissionDenied,
                        fmt::format("the auth key file {} belongs to uid {}, not to this user "
                                    "(uid {})",
                                    named, st.st_uid, ::geteuid()));
  } else if ((st.st_mode & 077) != 0) {
    status = make_error(Errc::kPermissionDenied,
                        fmt::format("the auth key file {} has mode {:03o}: group and others must "
                                    "not read it (chmod 600 {})",
                                    named, st.st_mode & 0777, target));
  } else if (st.st_size < static_cast<off_t>(kMinKeyBytes) ||
             st.st_size > static_cast<off_t>(kMaxKeyBytes)) {
    status = make_error(Errc::kInvalidArgument,
                        fmt::format("the auth key file {} has {} bytes; a key has {} to {} (make "
                                    "one with: head -c 32 /dev/urandom > {})",
                                    named, st.st_size, kMinKeyBytes, kMaxKeyBytes, path));
  } else {
    bytes.resize(static_cast<size_t>(st.st_size));
    size_t got = 0;
    while (got < bytes.size()) {
      const ssize_t n = ::read(fd, bytes.data() + got, bytes.size() - got);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        status = make_error(Errc::kSystem, fmt::format("reading the auth key file {}: {}", named,
                                                       n < 0 ? std::strerror(errno) : "short"));
        break;
      }
      got += static_cast<size_t>(n);
    }
    if (status) status = check_key_strength(bytes, path);
  }
  ::close(fd);
  if (!status) return status.error();
  return AuthKey(std::move(bytes));
}

Mac hmac_sha256(std::span<const uint8_t> key, std::string_view label,
                std::initializer_list<std::span<const uint8_t>> parts) {
  std::vector<uint8_t> input(label.begin(), label.end());
  for (std::span<const uint8_t> p : parts)
    input.insert(input.end(), p.begin(), p.end());
  Mac out{};
  unsigned int len = 0;
  if (HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()), input.data(), input.size(),
           out.data(), &len) == nullptr ||
      len != out.size())
    throw std::runtime_error("HMAC-SHA256 failed");  // OpenSSL without SHA-256: unusable
  return out;
}

Mac AuthKey::mac(std::string_view label,
                 std::initializer_list<std::span<const uint8_t>> parts) const {
  return hmac_sha256(key_, label, parts);
}

bool AuthKey::verify(std::string_view label, std::initializer_list<std::span<const uint8_t>> parts,
                     std::span<const uint8_t> proof) const {
  if (proof.size() != kMacBytes) return false;
  const Mac expected = mac(label, parts);
  return CRYPTO_memcmp(expected.data(), proof.data(), kMacBytes) == 0;
}

Nonce random_nonce() {
  Nonce n{};
  if (RAND_bytes(n.data(), static_cast<int>(n.size())) != 1)
    throw std::runtime_error("RAND_bytes failed");
  return n;
}

}  // namespace kvrelay
