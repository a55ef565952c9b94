#include "worker/net/session_seal.h"

#include <openssl/evp.h>

#include <climits>
#include <stdexcept>

namespace kvrelay::worker::net {

namespace {

constexpr std::string_view kClientToServer = "client->server";
constexpr std::string_view kServerToClient = "server->client";

void check(int ok, const char* what) {
  // Only a broken OpenSSL (no AES-GCM) gets here: nothing can be protected.
  if (ok != 1) throw std::runtime_error(std::string("AES-256-GCM: ") + what + " failed");
}

}  // namespace

SessionKeys derive_session_keys(const AuthKey& key, std::span<const uint8_t> server_nonce,
                                std::span<const uint8_t> client_nonce, Protection mode) {
  const uint8_t modes[1] = {static_cast<uint8_t>(mode)};
  const Mac prk = key.mac(kSessionLabel, {server_nonce, client_nonce, modes});
  SessionKeys k;
  k.client_to_server = hmac_sha256(prk, kClientToServer, {});
  k.server_to_client = hmac_sha256(prk, kServerToClient, {});
  return k;
}

struct RecordSeal::Cipher {
  EVP_CIPHER_CTX* ctx = nullptr;
  ~Cipher() { EVP_CIPHER_CTX_free(ctx); }
};

RecordSeal::RecordSeal(const SessionKey& key, Protection mode, Side side)
    : cipher_(std::make_unique<Cipher>()), mode_(mode), side_(side) {
  cipher_->ctx = EVP_CIPHER_CTX_new();
  if (cipher_->ctx == nullptr) throw std::runtime_error("EVP_CIPHER_CTX_new failed");
  if (side_ == Side::kSend)
    check(EVP_EncryptInit_ex(cipher_->ctx, EVP_aes_256_gcm(), nullptr, key.data(), nullptr),
          "init");
  else
    check(EVP_DecryptInit_ex(cipher_->ctx, EVP_aes_256_gcm(), nullptr, key.data(), nullptr),
          "init");
}

RecordSeal::~RecordSeal() = default;

void RecordSeal::begin() {
  uint8_t iv[12] = {};
  for (int i = 0; i < 8; ++i)
    iv[4 + i] = static_cast<uint8_t>(counter_ >> (8 * i));
  ++counter_;
  data_started_ = false;
  if (side_ == Side::kSend)
    check(EVP_EncryptInit_ex(cipher_->ctx, nullptr, nullptr, nullptr, iv), "iv");
  else
    check(EVP_DecryptInit_ex(cipher_->ctx, nullptr, nullptr, nullptr, iv), "iv");
}

void RecordSeal::add_plain(std::span<const std::byte> bytes) {
  int len = 0;
  for (size_t at = 0; at < bytes.size();) {
    const int n = static_cast<int>(std::min<size_t>(bytes.size() - at, INT_MAX / 2));
    const auto* p = reinterpret_cast<const unsigned char*>(bytes.data() + at);
    if (side_ == Side::kSend)
      check(EVP_EncryptUpdate(cipher_->ctx, nullptr, &len, p, n), "aad");
    else
      check(EVP_DecryptUpdate(cipher_->ctx, nullptr, &len, p, n), "aad");
    at += static_cast<size_t>(n);
  }
}

void RecordSeal::add(std::span<const std::byte> in, std::byte* out) {
  if (mode_ == Protection::kAuthenticate) return add_plain(in);
  data_started_ = true;
  int len = 0;
  for (size_t at = 0; at < in.size();) {
    const int n = static_cast<int>(std::min<size_t>(in.size() - at, INT_MAX / 2));
    const auto* src = reinterpret_cast<const unsigned char*>(in.data() + at);
    auto* dst = reinterpret_cast<unsigned char*>(out + at);
    if (side_ == Side::kSend)
      check(EVP_EncryptUpdate(cipher_->ctx, dst, &len, src, n), "encrypt");
    else
      check(EVP_DecryptUpdate(cipher_->ctx, dst, &len, src, n), "decrypt");
    at += static_cast<size_t>(n);
  }
}

Tag RecordSeal::finish_send() {
  int len = 0;
  unsigned char none[16];
  check(EVP_EncryptFinal_ex(cipher_->ctx, none, &len), "final");
  Tag tag{};
  check(EVP_CIPHER_CTX_ctrl(cipher_->ctx, EVP_CTRL_GCM_GET_TAG, static_cast<int>(kTagBytes),
                            tag.data()),
        "tag");
  return tag;
}

bool RecordSeal::finish_receive(std::span<const uint8_t, kTagBytes> tag) {
  uint8_t copy[kTagBytes];
  std::copy(tag.begin(), tag.end(), copy);
  check(EVP_CIPHER_CTX_ctrl(cipher_->ctx, EVP_CTRL_GCM_SET_TAG, static_cast<int>(kTagBytes), copy),
        "tag");
  int len = 0;
  unsigned char none[16];
  return EVP_DecryptFinal_ex(cipher_->ctx, none, &len) == 1;
}

}  // namespace kvrelay::worker::net
